"""Programmatic dependent launch (templates/_pdl.py.jinja) in the decode family's split calls,
compiled for sm90 on a CPU machine (Triton's own ptxas): the split kernel lets the combine launch
start as its programs leave, the combine is launched with the attribute and waits for the split
kernel's partial results before reading them; an unsplit call and a CPU call carry none of it
(the fp8 family's prologue and attention kernel: tests/codegen/test_compile_fp8_ws.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from attngen.env import REPO_ROOT

SCRIPT = textwrap.dedent("""
    import json, math, tempfile
    from pathlib import Path
    import torch
    from attngen.bench.probe import probe
    from attngen.families import decode as fd
    from attngen.kernels.common import MaskArgs
    from attngen.runtime import loader
    from attngen.spec import KernelSpec

    spec = KernelSpec("decode", "bf16", "sm90", 128, 128, 4, "causal")
    mod = loader.load(spec)
    B, hq, hkv, cap, d = 1, 8, 2, 4096, 128
    q = torch.empty(B, 1, hq, d, dtype=torch.bfloat16)
    k = torch.empty(B, cap, hkv, d, dtype=torch.bfloat16)
    cfg = fd.DecodeConfig(64, 4, 3, 8)
    n, split_len = fd.splits(cfg, B, hkv, cap, 132)
    ops, lps = fd.partial_shapes(B, hkv, n, fd.rows_tile(hq // hkv, 1), d)
    args = (mod, spec, q, k, k, torch.empty(B, 1, hq, d, dtype=torch.bfloat16), torch.empty(B, hq, 1),
            torch.empty(ops), torch.empty(lps), MaskArgs(1 / math.sqrt(d), 0.0, -1, 0, False), cfg)
    out = {"splits": n}
    tmp = Path(tempfile.mkdtemp())
    for use in (True, None):
        las = fd.decode_launches(*args, n, split_len, use_pdl=use)
        out[str(use)] = [{"values_pdl": la.values["PDL"], "pdl": la.pdl, **probe(la, tmp, None, la.fn.__name__)}
                         for la in las]
    one = fd.decode_launches(*args, 1, cap, use_pdl=True)
    out["one"] = [{"values_pdl": la.values["PDL"], "pdl": la.pdl} for la in one]
    print(json.dumps(out))
""")


def test_decode_split_combine_with_programmatic_dependent_launch():
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=REPO_ROOT,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    import json

    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["splits"] > 1, out
    split, combine = out["True"]
    # ptxas's uniform registers: every read follows a write on every path (attngen.bench.probe)
    assert all(r["undefined_uniform_reads"] == [] for r in out["True"] + out["None"]), out
    assert split["kernel"] == "_attn_decode" and combine["kernel"] == "_attn_decode_combine"
    assert split["values_pdl"] and not split["pdl"] and not split["launch_pdl"], split
    assert split["griddepcontrol"] == ["launch_dependents"], split
    assert combine["values_pdl"] and combine["pdl"] and combine["launch_pdl"], combine
    assert combine["griddepcontrol"] == ["wait"] and combine["wait_before_reads"], combine
    # a CPU tensor (no sm90 GPU): neither the attribute nor the instructions
    assert all(not r["values_pdl"] and not r["pdl"] and r["griddepcontrol"] == [] for r in out["None"]), out
    # one split: no combine launch, nothing to let start early
    assert [r["values_pdl"] for r in out["one"]] == [False] and not out["one"][0]["pdl"], out


# the same call with the merge in the split kernel (DecodeConfig.merge)
FUSED_SCRIPT = SCRIPT.replace("cfg = fd.DecodeConfig(64, 4, 3, 8)", "cfg = fd.DecodeConfig(64, 4, 3, 8, 'fused')")


def test_decode_fused_merge_is_one_launch_with_a_release_acquire_counter():
    """merge="fused" (DecodeConfig): a split call is one launch, without
    programmatic dependent launch; each program's partial stores precede one gpu-scope acq_rel
    increment of its row's counter, the merging program reads the partials past L1 (.cg) and
    resets the counter (relaxed exchange); nothing spills."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    res = subprocess.run([sys.executable, "-c", FUSED_SCRIPT], capture_output=True, text=True, env=env,
                         cwd=REPO_ROOT, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    import json

    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["splits"] > 1, out
    (run,) = out["True"]
    assert run["kernel"] == "_attn_decode" and not run["pdl"] and run["griddepcontrol"] == [], run
    assert [r["kernel"] for r in out["None"]] == ["_attn_decode"], out
    assert run["atomic_ops"] == ["gpu.acq_rel.add", "gpu.relaxed.exch"], run
    assert run["cg_loads"] > 0 and run["spill_stores"] == 0, run
