"""Every generated backward kernel, through the Triton interpreter: dQ, dK, dV against float64
autograd of the reference with the flash-attn gradient rule (<= 3x the error of PyTorch in the same
precision), both dQ paths (atomic and deterministic), poisoned outputs, golden samples."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from attngen.kernels.bwd import attn_bwd
from attngen.kernels.common import MaskArgs, mask_kind
from attngen.kernels.fwd import attn_fwd
from attngen.runtime.loader import load_path
from attngen.testing import attention_ref, check_grads, random_inputs
from attngen.tuning.space import BwdConfig, FwdConfig
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
    cfg = dataclasses.replace(TEST_CONFIG, atomic_dq=not deterministic)  # both dQ paths
    attn_bwd(load_path(path), spec, q, k, v, out, dout, lse, dq, dk, dv, args, cfg, deterministic)
    return q, k, v, dout, args.scale, (dq, dk, dv)


@pytest.mark.parametrize("spec,path", KERNELS, ids=[s.uri for s, _ in KERNELS])
def test_bwd_kernel(spec, path):
    for i, case in enumerate(cases_for(spec)):
        deterministic = i % 2 == 1  # both dQ paths on every kernel
        q, k, v, dout, scale, grads = run_bwd(spec, path, case, 2000 + i, deterministic)
        kw = dict(causal=case.causal, window_size=case.window, softcap=case.softcap, scale=scale,
                  top_left=case.top_left)
        errs = check_grads(f"{spec.uri}/{case.name}", lambda *t, upcast: attention_ref(*t, upcast=upcast, **kw)[0],
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
