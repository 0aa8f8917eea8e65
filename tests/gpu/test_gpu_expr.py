"""Expression kernels on the GPU: every case of tests/kernels/test_expr.py (masks, score
modifications, sinks; odd lengths, GQA, Sq != Sk) against float64 by the flash-attn rule, forward and
backward, with each target's family forced (sm80's pointer kernels, sm90's module), bitwise
reproducible gradients, the decode kernels' expressions on dense and paged caches, and the
warp-specialized Gluon backward with expressions forced (each pass checked to be the one that ran)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import attngen

from tests.kernels.test_expr import CASES, DECODE_CASES, _run, decode_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


@pytest.mark.parametrize("target", ["sm80", "sm90"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_expression_kernels(name, target):
    _run(name, torch.bfloat16 if target == "sm90" else torch.float16, 2, 6, 2, 203, 1023, 64, seed=11,
         target=target, device="cuda")


@pytest.mark.parametrize("name", ["alibi_causal", "t5_bias"])
def test_gpu_expression_gradients_deterministic(name):
    a = _run(name, torch.float16, 1, 4, 2, 1023, 1023, 128, seed=12, target="sm90", device="cuda")
    b = _run(name, torch.float16, 1, 4, 2, 1023, 1023, 128, seed=12, target="sm90", device="cuda")
    for x, y in zip(a[1], b[1]):
        assert torch.equal(x, y), f"{name}: gradients differ between two runs"


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("name", DECODE_CASES)
def test_gpu_expression_decode(name, paged):
    decode_case(name, paged, device="cuda")


# The warp-specialized Gluon kernels with expressions, forced: the forward with two consumers
# (except where an expression subscripts a parameter by a tile index: families/fwd.py, _gathers);
# the dK/dV pass with two consumers over 128 keys, or with split roles over 64 (its P^T hand-off
# carries a score modification's derivative); the Gluon dQ pass where the call has no parameter
# or sinks gradient to sum (families/bwd_config.py: ws_dq_takes), else the Triton dQ pass beside it.
GATHERS = {"documents_sorted", "document_ids", "documents_unsorted", "t5_bias"}
WS_PATHS = {"ws": dict(block_n=128), "ws_roles": dict(block_n=64, roles=True)}
WS_SHAPES = {64: (2, 6, 2, 203, 1023), 128: (1, 4, 2, 1023, 1023), 256: (1, 4, 2, 203, 1023)}


def _ws_run(name: str, path: str, hd: int):
    from attngen.families.bwd import BwdConfig
    from attngen.families.fwd import FwdConfig
    from attngen.runtime import api, dispatch

    api.clear_plans()
    B, Hq, Hkv, Sq, Sk = WS_SHAPES[hd]
    cfg = BwdConfig(64, 64, 4, 2, 128, 64, 4, 3, tma=True, consumers=2, dq_consumers=2)
    cfg = dataclasses.replace(cfg, **WS_PATHS[path])
    sinks = CASES[name][2]
    if sinks is not None or hd > 128:  # sinks are learned (the cases' captured tensors are constants)
        cfg = dataclasses.replace(cfg, dq_consumers=0)
    if hd > 128:  # the Triton dQ pass's tiles that fit hd256 (WS_BWD_ROLES')
        cfg = dataclasses.replace(cfg, dq_block_m=64, dq_block_n=64, dq_num_warps=4, dq_num_stages=2)
    fwd = FwdConfig(128, 64, 4, 2, tma=True, consumers=2)
    forced = {"bwd": cfg} if name in GATHERS else {"bwd": cfg, "fwd": fwd}
    with dispatch.forced_config(**forced):
        _run(name, torch.bfloat16, B, Hq, Hkv, Sq, Sk, hd, seed=17, target="sm90", device="cuda")
    launched = {n for kind in api.launched().values() for n, _ in kind}
    assert ("_attn_fwd_ws" in launched) == (name not in GATHERS), launched
    assert "_attn_bwd_dkdv_ws" in launched, launched
    assert ("_attn_bwd_dq_ws" in launched) == bool(cfg.dq_consumers), launched


@pytest.mark.parametrize("path", sorted(WS_PATHS))
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_expression_ws_backward(name, path):
    _ws_run(name, path, 64)


@pytest.mark.parametrize("name, path, hd", [("alibi_causal", "ws", 128), ("documents_sorted", "ws", 128),
                                            ("head_mask", "ws", 128), ("softcap_expr", "ws_roles", 128),
                                            ("prefix_lm", "ws_roles", 256), ("alibi_causal", "ws_roles", 256)])
def test_gpu_expression_ws_backward_widths(name, path, hd):
    _ws_run(name, path, hd)


@pytest.mark.parametrize("path, hd", [("ws", 64), ("ws_roles", 64), ("ws", 128), ("ws_roles", 256)])
def test_gpu_expression_varlen_ws_backward(path, hd):
    """Packed documents (attention_varlen) with a mask expression and a score modification
    through the Gluon backward passes, forced: each document's output and gradients against
    float64 by the flash-attn rule (queries and keys indexed within their document)."""
    from attngen.families.bwd import BwdConfig
    from attngen.runtime import api, dispatch
    from attngen.testing import assert_flash_rule, check_grads
    from tests.kernels.test_expr import reference

    api.clear_plans()
    g = torch.Generator().manual_seed(23)
    lens, Hq, Hkv = [1, 37, 203, 1023, 66], 4, 2
    T = sum(lens)
    mk = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16).cuda()  # noqa: E731
    q, k, v, dout = mk(T, Hq, hd), mk(T, Hkv, hd), mk(T, Hkv, hd), mk(T, Hq, hd)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    slope = (torch.rand(Hq, generator=g) * 0.1).cuda()
    mask_mod = lambda b, h, qi, ki: (ki <= qi) & ((qi - ki < 300) | (ki < 4))  # noqa: E731
    score_mod = lambda s, b, h, qi, ki: s - slope[h] * (qi - ki).abs()  # noqa: E731
    cfg = dataclasses.replace(BwdConfig(64, 64, 4, 2, 128, 64, 4, 3, tma=True, consumers=2, dq_consumers=2),
                              **WS_PATHS[path])
    if hd > 128:
        cfg = dataclasses.replace(cfg, dq_consumers=0, dq_block_m=64, dq_block_n=64, dq_num_warps=4,
                                  dq_num_stages=2)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    with dispatch.forced_config(bwd=cfg):
        out = attngen.attention_varlen(*leaves, cu, cu, max(lens), max(lens), mask_mod=mask_mod,
                                       score_mod=score_mod)
        grads = torch.autograd.grad(out, leaves, dout)
    torch.cuda.synchronize()
    launched = {n for kind in api.launched().values() for n, _ in kind}
    assert "_attn_bwd_dkdv_ws" in launched, launched
    assert ("_attn_bwd_dq_ws" in launched) == bool(cfg.dq_consumers), launched
    for a, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        doc = lambda t: t[a:e].transpose(0, 1)[None]  # noqa: E731
        fn = lambda q_, k_, v_, upcast: reference(q_, k_, v_, mask_mod, score_mod, upcast=upcast)  # noqa: E731
        assert_flash_rule(f"doc{a}/out", doc(out), fn(doc(q), doc(k), doc(v), True), fn(doc(q), doc(k), doc(v), False),
                          2.0)
        check_grads(f"{path}/hd{hd}/doc{a}", fn, (doc(q), doc(k), doc(v)), doc(dout),
                    [doc(x) for x in grads])
