"""Every shipped spec entry with expressions or sinks, called through the runtime as a user would
(the entry's mask, window, expressions as text, parameters, sinks, scale): the call must run the
generated kernel of that entry (generated/, not a module rendered on demand: the runtime's
identity of the call equals the spec's) and match a float64 reference that evaluates the same
expressions (attngen.spec.expr.eval_torch), forward and backward (learnable parameters and sinks
included), by the flash-attn rule."""

from __future__ import annotations

import math
import zlib

import pytest
import torch

import attngen
from attngen.runtime import api, dispatch, loader
from attngen.spec import expr as X
from attngen.spec.expr_eval import eval_torch
from attngen.spec.loading import load_spec
from attngen.testing import assert_flash_rule, check_grads
from tests.kernels.test_expr import reference

ENTRIES = [(f, e) for f in ("gpt_oss_20b", "llama4_scout", "gemma3_prefix_lm", "t5_base", "bloom_alibi")
           for e in load_spec(f"specs/{f}.yaml").entries if e.mask_expr or e.score_expr or e.sinks]


def _params(e, B, Hq, g):
    out = {}
    for d in e.params:
        shape = tuple(B if s == "b" else Hq if s == "h" else s for s in d.shape)
        if d.dtype == "int32":
            out[d.name] = torch.randint(0, 40, shape, generator=g, dtype=torch.int32)
        else:
            out[d.name] = (torch.rand(shape, generator=g) * 0.5).requires_grad_(d.learnable)
    return out


def _reference(q, k, v, e, params, sinks, scale, upcast=True):
    """test_expr.reference with the entry's expressions evaluated by expr_eval and its built-in mask."""
    decls = {d.name: d for d in e.params}
    env = lambda b, h, qi, ki, **kw: {"b": b, "h": h, "q_idx": qi, "kv_idx": ki, "seqlen_q": q.shape[2],  # noqa: E731
                                      "seqlen_k": k.shape[2], **kw}
    mask = score = None
    if e.mask_expr:
        node = X.parse(e.mask_expr, "mask", decls)
        mask = lambda b, h, qi, ki: eval_torch(node, env(b, h, qi, ki), params)  # noqa: E731
    if e.mask == "sliding_window":
        inner = mask or (lambda b, h, qi, ki: True)
        mask = lambda b, h, qi, ki: inner(b, h, qi, ki) & (ki > qi - e.window)  # noqa: E731
    if e.score_expr:
        node_s = X.parse(e.score_expr, "score", decls)
        score = lambda s, b, h, qi, ki: eval_torch(node_s, env(b, h, qi, ki, score=s), params).to(s.dtype)  # noqa: E731
    return reference(q, k, v, mask, score, sinks, e.mask in ("causal", "sliding_window"), upcast, scale)


@pytest.mark.parametrize("f, e", ENTRIES, ids=[f"{f}-{e.name}" for f, e in ENTRIES])
@pytest.mark.parametrize("target", ["sm80", "sm90"])
def test_shipped_expression_entry(f, e, target):
    g = torch.Generator().manual_seed(zlib.crc32(f"{f}/{e.name}/{target}".encode()))
    B, Hkv, Sq, Sk = 2, 1, 67, 91
    Hq = Hkv * e.gqa_ratio
    D = e.head_dim_qk
    dtype = torch.bfloat16 if target == "sm90" else torch.float16
    mk = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    q, k, v, dout = mk(B, Hq, Sq, D), mk(B, Hkv, Sk, D), mk(B, Hkv, Sk, D), mk(B, Hq, Sq, D)
    params = _params(e, B, Hq, g)
    sinks = torch.randn(Hq, generator=g).requires_grad_(True) if e.sinks else None
    scale = e.softmax_scale or 1.0 / math.sqrt(D)
    window = (e.window - 1, 0) if e.mask == "sliding_window" else (-1, -1)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    api.clear_plans()
    with dispatch.forced_target(target):
        out = attngen.attention(*leaves, causal=e.mask in ("causal", "sliding_window"), window_size=window,
                                mask_mod=e.mask_expr or None, score_mod=e.score_expr or None, params=params or None,
                                sinks=sinks, scale=scale)
        learn = [t for t in params.values() if t.requires_grad]
        grads = torch.autograd.grad(out, leaves + learn, dout)
    plans = list(api._FWD.values())
    assert len(plans) == 1 and loader.built_module_path(plans[0].spec) is not None, (
        f"{f}/{e.name}: the call ran {plans[0].spec.uri}, not a generated kernel of the spec")
    ref = _reference(q, k, v, e, params, sinks, scale)
    ref_pt = _reference(q, k, v, e, params, sinks, scale, upcast=False)
    assert_flash_rule(f"{e.name}/out", out, ref, ref_pt, 2.0)
    check_grads(e.name, lambda q_, k_, v_, upcast: _reference(q_, k_, v_, e, params, sinks, scale, upcast),
                [q, k, v], dout, grads[:3])
    for t, got in zip(learn, grads[3:]):
        t64 = t.detach().double().requires_grad_(True)
        pr = {n: (t64 if p is t else p) for n, p in params.items()}
        r = torch.autograd.grad(_reference(q, k, v, e, pr, sinks, scale), t64, dout.double())[0]
        t32 = t.detach().clone().requires_grad_(True)
        pr = {n: (t32 if p is t else p) for n, p in params.items()}
        r_pt = torch.autograd.grad(_reference(q, k, v, e, pr, sinks, scale, upcast=False), t32, dout)[0]
        assert_flash_rule(f"{e.name}/dparam", got, r, r_pt, 3.0)
