"""Expression kernels beside FlexAttention on the GPU: the same mask_mod / score_mod callables given
to attngen and to PyTorch's flex_attention (its block mask from the same mask_mod; sinks through an
LSE correction after its kernel), outputs and gradients. Both are held to the float64 reference by
the flash-attn rule, and their difference to the sum of their own errors (they agree as closely as
two correct kernels can)."""

from __future__ import annotations

import pytest
import torch

import attngen
from attngen.testing import assert_flash_rule
from tests.kernels.test_expr import _inputs, cases, reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


def _flex(q, k, v, mask_mod, score_mod, sinks, causal):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, Hq, Sq, _ = q.shape
    Sk = k.shape[2]
    off = Sk - Sq  # attngen's q_idx is bottom-right: row + Sk - Sq

    def mm(b, h, qi, ki):
        keep = (ki <= qi + off) if causal else (ki >= 0)
        return keep & mask_mod(b, h, qi + off, ki) if mask_mod is not None else keep

    sm = None if score_mod is None else (lambda s, b, h, qi, ki: score_mod(s, b, h, qi + off, ki))
    bm = create_block_mask(mm, B, None, Sq, Sk, device=q.device)
    o, lse = flex_attention(q, k, v, score_mod=sm, block_mask=bm, enable_gqa=Hq != k.shape[1], return_lse=True)
    if sinks is None:
        return o
    w = torch.sigmoid(lse - sinks[None, :, None])  # the sink's share of each row's denominator
    return (o.float() * w[..., None]).to(o.dtype)


@pytest.mark.parametrize("name", sorted(cases()))
def test_gpu_expression_matches_flex(name):
    mask_mod, score_mod, sinks, causal = cases("cuda")[name]
    Hq = 4
    q, k, v, dout = _inputs(1, Hq, 2, 203, 259, 64, torch.bfloat16, 21, "cuda")
    sinks = None if sinks is None else sinks[:Hq].to("cuda")
    leaves_a = [t.clone().requires_grad_(True) for t in (q, k, v)]
    leaves_f = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out_a = attngen.attention(*leaves_a, causal=causal, mask_mod=mask_mod, score_mod=score_mod, sinks=sinks)
    out_f = _flex(*leaves_f, mask_mod, score_mod, sinks, causal)
    ga = torch.autograd.grad(out_a, leaves_a, dout)
    gf = torch.autograd.grad(out_f, leaves_f, dout)
    leaves64 = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref = reference(*leaves64, mask_mod, score_mod, sinks, causal)
    g64 = torch.autograd.grad(ref, leaves64, dout.double())
    ref_pt = reference(q, k, v, mask_mod, score_mod, sinks, causal, upcast=False)
    for who, out in (("attngen", out_a), ("flex", out_f)):
        assert_flash_rule(f"{name}/{who} out", out, ref, ref_pt, 2.0)
    err = lambda x, r: (x.double() - r).abs().max().item()  # noqa: E731
    assert err(out_a, out_f.double()) <= err(out_a, ref) + err(out_f, ref) + 1e-6, f"{name}: outputs"
    for n, a, f, r in zip("qkv", ga, gf, g64):
        assert err(a, f.double()) <= 2 * (err(a, r) + err(f, r)) + 1e-6, f"{name}: d{n} differ beyond both errors"
