"""Whether the decode kernels of an older build compile to the same PTX as today's with
merge="launch" (sm90, Triton's compiler on the CPU; .loc / .file lines, comments and debug
sections dropped): the check behind re-keying the shipped decode winners to the FUSED kernel's
hash (tuning_db/README.md, session 61). The older modules come from git:

    mkdir -p /tmp/oldmods && for f in $(git ls-tree --name-only ddd61a1 generated/ | grep -E \
        'attn_decode_bf16_hd(128_gqa4|128_gqa1|64_gqa4)_causal_sm90'); do
      git show ddd61a1:$f > /tmp/oldmods/$(basename $f); done
    TRITON_INTERPRET=0 python3 benchmarks/tools/decode_same_ptx.py /tmp/oldmods

Prints, per module and call shape, one boolean per launch (split kernel, combine)."""
import json, math, re, sys, tempfile
from pathlib import Path
import torch
from triton.backends.compiler import GPUTarget
import triton
from triton.compiler import ASTSource
from attngen.bench.probe import signature
from attngen.families import decode as fd
from attngen.kernels.common import MaskArgs
from attngen.runtime import loader
from attngen.spec import KernelSpec

def ptx_of(la):
    sig, const, attrs = signature(la)
    ck = triton.compile(ASTSource(la.fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32), options=la.options)
    p = ck.asm["ptx"]
    p = re.sub(r"^\s*\.loc.*$|^\s*\.file.*$", "", p, flags=re.M)
    p = p[:p.find(".section\t.debug")] if ".section\t.debug" in p else p
    return "\n".join(l for l in p.splitlines() if l.strip() and not l.strip().startswith("//"))

olds = {p.name.rsplit("_", 1)[0]: p for p in Path(sys.argv[1]).glob("*.py")}
res = {}
for uri, path in sorted(olds.items()):
    hd = 64 if "hd64" in uri else 128
    gqa = 1 if "gqa1" in uri else 4
    spec = KernelSpec("decode", "bf16", "sm90", hd, hd, gqa, "causal")
    new, old = loader.load(spec), loader.load_path(path)
    hq = 8 * gqa; hkv = 8
    for B, cap, cfg in ((1, 32768, fd.DecodeConfig(128, 8, 2)), (8, 32768, fd.DecodeConfig(128, 8, 2)),
                        (1, 4096, fd.DecodeConfig(64, 4, 3)), (64, 4096, fd.DecodeConfig(64, 2, 3))):
        n, sl = fd.splits(cfg, B, hkv, cap, 132)
        q = torch.empty(B, 1, hq, hd, dtype=torch.bfloat16)
        k = torch.empty(B, cap, hkv, hd, dtype=torch.bfloat16)
        ops, lps = fd.partial_shapes(B, hkv, n, fd.rows_tile(gqa, 1), hd)
        lens = torch.empty(B, dtype=torch.int32)
        args = lambda mod, c: fd.decode_launches(mod, spec, q, k, k, torch.empty(B, 1, hq, hd, dtype=torch.bfloat16),
                                                 torch.empty(B, hq, 1), torch.empty(ops), torch.empty(lps),
                                                 MaskArgs(1 / math.sqrt(hd), 0.0, -1, 0, False), c, n, sl, lens,
                                                 use_pdl=True)
        import dataclasses
        a = [ptx_of(la) for la in args(old, dataclasses.replace(cfg, merge="launch"))]
        b = [ptx_of(la) for la in args(new, dataclasses.replace(cfg, merge="launch"))]
        same = [x == y for x, y in zip(a, b)] if len(a) == len(b) else "different launch count"
        res[f"{uri} B{B} S{cap} {cfg.block_n},{cfg.num_warps},{cfg.num_stages} splits {n}"] = same
        if same is not True and not all(same if isinstance(same, list) else [False]):
            import difflib
            for x, y in zip(a, b):
                if x != y:
                    print("\n".join(list(difflib.unified_diff(x.splitlines(), y.splitlines(), lineterm=""))[:30]))
                    break
print(json.dumps(res, indent=1))
