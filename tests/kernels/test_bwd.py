"""Every generated backward kernel, through the Triton interpreter: dQ, dK, dV against float64
autograd of the reference with the flash-attn gradient rule (<= 3x the error of PyTorch in the same
precision), both dQ paths (atomic and deterministic), poisoned outputs, golden samples."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from attngen.families.bwd import attn_bwd
from attngen.kernels.common import MaskArgs, mask_kind
from attngen.families.fwd import attn_fwd
from attngen.runtime.loader import load_path
from attngen.problem import random_inputs
from attngen.testing import check_grads
from attngen.configs import BwdConfig, FwdConfig
from tests.kernels import golden
from tests.kernels.cases import built_kernels, cases_for, make_qkv

KERNELS = built_kernels("bwd", varlen=False)
FWD = {s.replace(family="bwd"): p for s, p in built_kernels("fwd", varlen=False)}
FWD_CONFIG = FwdConfig(64, 32, 4, 1)
# 32 x 32 tiles: with seqlens 113/203 every stage of both loops runs
TEST_CONFIG = BwdConfig(32, 32, 4, 1, 32, 32, 4, 1)


def nan_like(t):
    return torch.full_like(t, float("nan"))


def run_bwd(spec, path, case, seed, deterministic):
    q, k, v = make_qkv(spec, case, seed)
    dout, = random_inputs(q.shape[:3] + (spec.head_dim_v,), dtype=q.dtype, seed=seed + 1)
    mask, wl, wr = mask_kind(case.causal, case.window)
    assert mask == spec.mask
    args = MaskArgs(scale=1.0 / math.sqrt(spec.head_dim_qk), softcap=case.softcap, window_left=wl,
                    window_right=wr, align_top_left=case.top_left)
    fwd_spec = spec.replace(family="fwd")
    out = torch.empty(q.shape[:3] + (spec.head_dim_v,), dtype=q.dtype)
    lse = torch.empty(q.shape[:3])
    attn_fwd(load_path(FWD[spec]), fwd_spec, q, k, v, out, lse, args, FWD_CONFIG)
    dq, dk, dv = nan_like(q), nan_like(k), nan_like(v)
    # both dQ paths; the sm90 family runs its TMA kernels (_attn_bwd_dkdv_tma, with the dQ tiles
    # by TMA reduce-add on the atomic path, and _attn_bwd_dq_tma), its pointer kernels being the
    # sm80 code tested there
    cfg = dataclasses.replace(TEST_CONFIG, atomic_dq=not deterministic, tma=spec.target == "sm90")
    attn_bwd(load_path(path), spec, q, k, v, out, dout, lse, dq, dk, dv, args, cfg, deterministic)
    return q, k, v, dout, args.scale, (dq, dk, dv)


@pytest.mark.parametrize("spec,path", KERNELS, ids=[s.uri for s, _ in KERNELS])
def test_bwd_kernel(spec, path):
    for i, case in enumerate(cases_for(spec)):
        deterministic = i % 2 == 1  # both dQ paths on every kernel
        q, k, v, dout, scale, grads = run_bwd(spec, path, case, 2000 + i, deterministic)
        problem = case.problem(spec)
        assert problem.softmax_scale == scale
        errs = check_grads(f"{spec.uri}/{case.name}", lambda *t, upcast: problem.reference(*t, upcast=upcast)[0],
                           (q, k, v), dout, grads)
        golden.check("bwd", spec.uri, case.name, dict(zip(("dq", "dk", "dv"), grads)),
                     {n: e for n, (e, _) in errs.items()})


def test_deterministic_paths_agree():
    """Atomic and deterministic dQ compute the same gradient; dK/dV do not depend on the path."""
    spec, path = next((s, p) for s, p in KERNELS if s.mask == "causal" and s.dtype == "fp16")
    case = cases_for(spec)[0]
    _, _, _, _, _, g_atomic = run_bwd(spec, path, case, 5, deterministic=False)
    _, _, _, _, _, g_det = run_bwd(spec, path, case, 5, deterministic=True)
    torch.testing.assert_close(g_atomic[0], g_det[0], atol=2e-3, rtol=0)
    assert torch.equal(g_atomic[1], g_det[1]) and torch.equal(g_atomic[2], g_det[2]), \
        "dK/dV differ between the dQ paths"


@pytest.mark.parametrize("hd", [96, 256])
def test_sm90_split_dkdv(hd):
    """split_dkdv: dK and dV from two launches of the TMA dK/dV kernel (WANT_DK / WANT_DV), on
    both dQ paths (the reduce-adds of atomic dQ in the dK launch): the same gradients, bit for bit,
    as the one launch that computes both (same tiles, same accumulation order)."""
    from attngen.families.bwd import bwd_launches

    spec, path = next((s, p) for s, p in KERNELS if s.target == "sm90" and s.head_dim_qk == hd)
    case = cases_for(spec)[0]
    for det in (False, True):
        grads = {}
        for split in (False, True):
            q, k, v = make_qkv(spec, case, 17)
            dout, = random_inputs(q.shape[:3] + (spec.head_dim_v,), dtype=q.dtype, seed=18)
            mask, wl, wr = mask_kind(case.causal, case.window)
            args = MaskArgs(scale=1.0 / math.sqrt(hd), softcap=case.softcap, window_left=wl,
                            window_right=wr, align_top_left=case.top_left)
            out, lse = torch.empty(q.shape[:3] + (spec.head_dim_v,), dtype=q.dtype), torch.empty(q.shape[:3])
            attn_fwd(load_path(FWD[spec]), spec.replace(family="fwd"), q, k, v, out, lse, args, FWD_CONFIG)
            cfg = dataclasses.replace(TEST_CONFIG, atomic_dq=not det, tma=True, split_dkdv=split)
            la = bwd_launches(load_path(path), spec, q, k, v, out, dout, lse, lse, q, k, v, args, cfg, not det)
            wants = [(x.values["WANT_DK"], x.values["WANT_DV"]) for x in la if x.fn.__name__ == "_attn_bwd_dkdv_tma"]
            assert wants == ([(True, False), (False, True)] if split else [(True, True)])
            g = (nan_like(q), nan_like(k), nan_like(v))
            attn_bwd(load_path(path), spec, q, k, v, out, dout, lse, *g, args, cfg, det)
            assert all(torch.isfinite(t).all() for t in g), f"split={split}: a gradient left unwritten"
            grads[split] = g
        for name, a, b in zip(("dq", "dk", "dv"), grads[False], grads[True]):
            assert torch.equal(a, b), f"{spec.uri} deterministic={det} {name}: split_dkdv changed it"


def test_sm90_backward_goes_through_the_tma_kernels():
    """With tma the sm90 family's dK/dV and dQ launches are its TMA kernels, with one descriptor per
    tensor and head-dim tile (query-side tiles of the pass's query block, key-side of its key
    block), the atomic path adding dQ by TMA reduce-adds; they compute the same gradients as the
    pointer kernels. The sm80 family keeps the pointer kernels."""
    from attngen.families.bwd import bwd_launches

    spec, path = next((s, p) for s, p in KERNELS if s.target == "sm90" and s.head_dim_qk == 96
                      and s.dtype == "fp16")
    mod = load_path(path)
    case = cases_for(spec)[0]
    q, k, v = make_qkv(spec, case, 11)
    lse = torch.empty(q.shape[:3])
    args = MaskArgs(scale=0.1, softcap=case.softcap, window_left=-1, window_right=0, align_top_left=False)
    cfg = dataclasses.replace(TEST_CONFIG, atomic_dq=True, tma=True)
    dq32 = torch.zeros(q.shape, dtype=torch.float32)
    la = bwd_launches(mod, spec, q, k, v, q, q, lse, lse, dq32, k, v, args, cfg, True)
    assert [x.fn.__name__ for x in la] == ["_attn_bwd_preprocess", "_attn_bwd_dkdv_tma"]
    descs = la[1].descriptors
    assert sorted(descs) == sorted(f"desc_{t}{i}" for t in ("q", "k", "v", "do", "dq", "dk", "dv") for i in (0, 1))
    assert descs["desc_dq1"][3] == [1, 1, cfg.block_m, 32] and descs["desc_k0"][3] == [1, 1, cfg.block_n, 64]
    la = bwd_launches(mod, spec, q, k, v, q, q, lse, lse, q, k, v, args, cfg, False)
    assert [x.fn.__name__ for x in la] == ["_attn_bwd_preprocess", "_attn_bwd_dkdv_tma", "_attn_bwd_dq_tma"]
    assert la[2].descriptors["desc_k1"][3] == [1, 1, cfg.dq_block_n, 32]
    assert "desc_dk0" not in la[2].descriptors
    la = bwd_launches(mod, spec, q, k, v, q, q, lse, lse, q, k, v, args, dataclasses.replace(cfg, tma=False), False)
    assert [x.fn.__name__ for x in la] == ["_attn_bwd_preprocess", "_attn_bwd_dkdv", "_attn_bwd_dq"]
    fspec, fpath = next((s, p) for s, p in KERNELS if s.target == "sm80" and s.head_dim_qk == 96
                        and s.dtype == "fp16")
    _, _, _, _, _, g_ptr = run_bwd(fspec, fpath, case, 5, deterministic=True)
    for det in (False, True):
        _, _, _, _, _, g_tma = run_bwd(spec, path, case, 5, deterministic=det)
        torch.testing.assert_close(g_tma[0], g_ptr[0], atol=2e-3, rtol=0)
        torch.testing.assert_close(g_tma[1], g_ptr[1], atol=2e-3, rtol=0)
        torch.testing.assert_close(g_tma[2], g_ptr[2], atol=2e-3, rtol=0)


def test_sm90_operands_in_registers_change_nothing():
    """q_regs (the forward's Q tile in registers) and dq_regs (the dQ pass's Q and dO in
    registers) only change where the compiler keeps those tiles (the rows past the end are zeroed,
    which the copy engine's zero fill already gave): O, LSE and dQ bit for bit as without them, on
    a case whose last query block runs past the end (Sq = 113)."""
    spec, path = next((s, p) for s, p in KERNELS if s.target == "sm90" and s.head_dim_qk == 128
                      and s.mask == "causal")
    fspec = spec.replace(family="fwd")
    case = cases_for(spec)[0]
    assert case.sq % 32, "the case must leave a partial query block"
    q, k, v = make_qkv(spec, case, 23)
    dout, = random_inputs(q.shape[:3] + (spec.head_dim_v,), dtype=q.dtype, seed=24)
    mask, wl, wr = mask_kind(case.causal, case.window)
    args = MaskArgs(scale=1.0 / math.sqrt(spec.head_dim_qk), softcap=case.softcap, window_left=wl,
                    window_right=wr, align_top_left=case.top_left)
    res = {}
    for regs in (False, True):
        out, lse = nan_like(torch.empty(q.shape[:3] + (spec.head_dim_v,), dtype=q.dtype)), nan_like(torch.empty(q.shape[:3]))
        attn_fwd(load_path(FWD[spec]), fspec, q, k, v, out, lse, args, FwdConfig(32, 32, 4, 1, tma=True, q_regs=regs))
        g = (nan_like(q), nan_like(k), nan_like(v))
        cfg = dataclasses.replace(TEST_CONFIG, tma=True, dq_regs=regs)
        attn_bwd(load_path(path), spec, q, k, v, out, dout, lse, *g, args, cfg, True)
        assert all(torch.isfinite(t).all() for t in (out, lse) + g), f"regs={regs}: an output left unwritten"
        res[regs] = (out, lse) + g
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), res[False], res[True]):
        assert torch.equal(a, b), f"{spec.uri}: {name} differs with the operands in registers"
