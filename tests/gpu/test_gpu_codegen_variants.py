"""GPU: kernel forms that only a codegen option renders (A/B candidates, not the build's), checked
before they are timed: the Gluon dK/dV pass's program order (dkdv_order=lpt) against the grouped
order bit for bit and against float64 on odd shapes with the flash-attn rule (gradients <= 3x
PyTorch's same-precision error), gradients poisoned with NaN first; the decode family's fused
merge (DecodeConfig.merge="fused", a config since session 61) against the combine launch on many splits (within a few fp32 ulps of
the LSE and one bf16 ulp of the output), call after call on one counter tensor, which stays at
zero. (The dQ-inside forms of the dK/dV pass, ws_dq, were measured and removed: docs/notes.md.)"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from attngen.codegen.render import render
from attngen.configs import default_bwd_config, default_fwd_config
from attngen.families import decode as fd
from attngen.families.bwd import attn_bwd
from attngen.families.fwd import attn_fwd
from attngen.kernels.common import MaskArgs
from attngen.runtime import loader
from attngen.problem import attention_ref
from attngen.spec import KernelSpec
from attngen.testing import assert_flash_rule

pytestmark = pytest.mark.gpu


def _variant(spec: KernelSpec, options: dict, tmp_path):
    path = tmp_path / f"{spec.uri}_{'_'.join(f'{k}-{v}' for k, v in options.items())}.py"
    path.write_text(render(spec, options=options))
    return loader.load_path(path)


def _grads(q, k, v, do, scale, causal, upcast):
    """dQ, dK, dV of attngen.problem.attention_ref (float64, or the inputs' precision: the flash-attn
    rule's budget), bottom-right causal."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out, _ = attention_ref(*leaves, causal=causal, scale=scale, upcast=upcast)
    return torch.autograd.grad(out, leaves, do.to(out.dtype))


@pytest.mark.parametrize("shape", [(1, 32, 8, 1023, 1023, 128, True), (2, 8, 8, 203, 777, 96, True),
                                   (1, 8, 2, 1024, 1024, 64, False)],
                         ids=lambda s: "b{}_h{}x{}_q{}_k{}_hd{}{}".format(*s[:6], "_causal" * s[6]))
def test_dkdv_program_order_changes_no_bit(shape, tmp_path):
    """dkdv_order=lpt only reorders the Gluon dK/dV pass's programs: each program's arithmetic is
    the same, so the gradients equal the grouped order's bit for bit (the default config: the
    Gluon passes at hd64 / hd96 / hd128), and they pass the flash-attn rule against float64."""
    B, H, Hkv, Sq, Sk, D, causal = shape
    g = torch.Generator(device="cuda").manual_seed(Sq + D)
    q = torch.randn(B, H, Sq, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    do = torch.randn(B, H, Sq, D, device="cuda", dtype=torch.bfloat16, generator=g)
    fspec = KernelSpec("fwd", "bf16", "sm90", D, D, H // Hkv, "causal" if causal else "none")
    bspec = fspec.replace(family="bwd")
    m = MaskArgs(1 / math.sqrt(D), 0.0, -1, 0 if causal else -1, False)
    out, lse = torch.empty_like(q), torch.empty(B, H, Sq, device="cuda")
    attn_fwd(loader.load(fspec), fspec, q, k, v, out, lse, m, default_fwd_config(fspec, "cuda", Sq))
    cfg = default_bwd_config(bspec)
    assert cfg.consumers == 2, cfg  # the Gluon dK/dV pass serves
    grads = {}
    for order in ("grouped", "lpt"):
        mod = _variant(bspec, {"dkdv_order": order}, tmp_path)
        got = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
        attn_bwd(mod, bspec, q, k, v, out, do, lse, *got, m, cfg, True)
        grads[order] = got
    torch.cuda.synchronize()
    want, pt = _grads(q, k, v, do, m.scale, causal, True), _grads(q, k, v, do, m.scale, causal, False)
    for name, a, b, w, p in zip(("dq", "dk", "dv"), grads["grouped"], grads["lpt"], want, pt):
        assert torch.equal(a, b), name
        assert_flash_rule(f"lpt {shape} {name}", b, w, p, 3.0, atol=1e-4)


@pytest.mark.parametrize("B, hq, hkv, cap", [(1, 32, 8, 4096), (1, 32, 8, 32768), (3, 16, 16, 9000)])
def test_decode_fused_merge_matches_the_combine_launch(B, hq, hkv, cap, tmp_path):
    spec = KernelSpec("decode", "bf16", "sm90", 128, 128, hq // hkv, "causal")
    mod = loader.load(spec)  # one module: the merge form is the config's (DecodeConfig.merge)
    g = torch.Generator(device="cuda").manual_seed(cap)
    kc, vc = (torch.randn(B, cap, hkv, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    lens = torch.randint(1, cap + 1, (B,), device="cuda", generator=g, dtype=torch.int32)
    base = fd.default_decode_config(spec, "cuda")
    n, split_len = fd.splits(base, B, hkv, cap, torch.cuda.get_device_properties(0).multi_processor_count)
    assert n > 1
    ops, lps = fd.partial_shapes(B, hkv, n, fd.rows_tile(hq // hkv, 1), 128)
    margs = MaskArgs(1 / math.sqrt(128), 0.0, -1, 0, False)
    counter = torch.zeros(B * hkv, dtype=torch.int32, device="cuda")
    for call in range(20):
        q = torch.randn(B, 1, hq, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        outs = {}
        for form in ("launch", "fused"):
            cfg = dataclasses.replace(base, merge=form)
            out = torch.full((B, 1, hq, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
            lse = torch.full((B, hq, 1), float("nan"), device="cuda")
            op, lp = torch.full(ops, float("nan"), device="cuda"), torch.full(lps, float("nan"), device="cuda")
            las = fd.decode_launches(mod, spec, q, kc, vc, out, lse, op, lp, margs, cfg, n, split_len, lens,
                                     counter=counter if form == "fused" else None)
            assert len(las) == (1 if form == "fused" else 2)
            for la in las:
                la.run()
            outs[form] = (out, lse)
        torch.cuda.synchronize()
        # the same merge code in the same split order, compiled inside kernels of different warp
        # counts: the sum over the splits may round differently (a few fp32 ulps of the LSE; the
        # first H100 run differed there), never more
        torch.testing.assert_close(outs["fused"][1], outs["launch"][1], rtol=4e-7, atol=4e-7, msg=f"call {call}")
        torch.testing.assert_close(outs["fused"][0].float(), outs["launch"][0].float(), rtol=2 ** -8, atol=1e-6,
                                   msg=f"call {call}")
        assert not counter.any(), (call, counter)
