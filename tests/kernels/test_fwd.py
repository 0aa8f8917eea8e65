"""Every generated forward kernel, through the Triton interpreter, on small odd shapes: the
flash-attn accuracy rule against float64, every output written, and golden outputs."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from attngen.kernels.common import MaskArgs, mask_kind
from attngen.families.fwd import attn_fwd
from attngen.runtime.loader import load_path
from attngen.testing import assert_flash_rule, assert_lse_close, max_err
from attngen.configs import FwdConfig
from tests.kernels import golden
from tests.kernels.cases import built_kernels, cases_for, make_qkv

KERNELS = built_kernels("fwd", varlen=False)
# small tiles so that every loop stage (leading masked, unmasked, trailing masked) runs
TEST_CONFIG = FwdConfig(block_m=32, block_n=32, num_warps=4, num_stages=1)


def run_case(spec, path, case, seed, cfg=TEST_CONFIG):
    mod = load_path(path)
    q, k, v = make_qkv(spec, case, seed)
    mask, wl, wr = mask_kind(case.causal, case.window)
    assert mask == spec.mask, f"case {case.name} does not fit kernel mask {spec.mask}"
    scale = 1.0 / math.sqrt(spec.head_dim_qk)
    args = MaskArgs(scale=scale, softcap=case.softcap, window_left=wl, window_right=wr,
                    align_top_left=case.top_left)
    out = torch.full((q.shape[0], q.shape[1], case.sq, spec.head_dim_v), float("nan"), dtype=q.dtype)
    lse = torch.full((q.shape[0], q.shape[1], case.sq), float("nan"))
    attn_fwd(mod, spec, q, k, v, out, lse, args, cfg)
    return q, k, v, out, lse, scale


def config_for(spec, i):
    """The sm90 family's dense kernels run their TMA kernel here (their pointer kernel is the sm80
    code, tested there): plain or warp-specialized key loop, one program per tile or persistent
    (the interpreter counts 2 SMs, so a persistent program walks several tiles); lazy rescaling
    and the Q tile in registers alternate too (cases cycle through them)."""
    if spec.target == "sm90":
        return [FwdConfig(32, 32, 4, 1, tma=True, lazy_rescale=True, q_regs=True),
                FwdConfig(32, 32, 8, 1, tma=True, warp_specialize=True),
                FwdConfig(32, 32, 4, 1, tma=True, persistent=1, q_regs=True),
                FwdConfig(32, 32, 8, 1, tma=True, persistent=2, warp_specialize=True, lazy_rescale=True)][i % 4]
    return dataclasses.replace(TEST_CONFIG, lazy_rescale=i % 2 == 1)


@pytest.mark.parametrize("spec,path", KERNELS, ids=[s.uri for s, _ in KERNELS])
def test_fwd_kernel(spec, path):
    for i, case in enumerate(cases_for(spec)):
        q, k, v, out, lse, scale = run_case(spec, path, case, seed=1000 + i, cfg=config_for(spec, i))
        problem = case.problem(spec)
        assert problem.softmax_scale == scale
        ref, ref_lse = problem.reference(q, k, v)
        pt, _ = problem.reference(q, k, v, upcast=False)
        name = f"{spec.uri}/{case.name}"
        err, _ = assert_flash_rule(name, out, ref, pt, factor=2.0)
        assert_lse_close(name, lse, ref_lse)
        fin = torch.isfinite(ref_lse)
        lse_err = max_err(lse[fin], ref_lse[fin])
        # rows the mask leaves empty are exactly zero (never NaN)
        empty = ~problem.keep().any(-1)
        if empty.any():
            assert (out[:, :, empty] == 0).all(), f"{name}: empty rows are not zero"
        golden.check("fwd", spec.uri, case.name, {"out": out, "lse": lse},
                     {"out": err, "lse": lse_err})


def test_config_independence():
    """The same kernel with other launch configs computes the same function."""
    spec, path = next((s, p) for s, p in KERNELS if s.mask == "sliding_window" and s.dtype == "fp16")
    case = cases_for(spec)[0]
    outs = []
    for cfg in (TEST_CONFIG, FwdConfig(16, 32, 4, 1), FwdConfig(64, 64, 4, 1)):
        q, k, v, out, lse, scale = run_case(spec, path, case, seed=7, cfg=cfg)
        outs.append((out, lse))
    for out, lse in outs[1:]:
        torch.testing.assert_close(out, outs[0][0], atol=2e-3, rtol=0,
                                   msg=lambda m: f"output changes with the launch config: {m}")
        torch.testing.assert_close(lse, outs[0][1], atol=1e-4, rtol=0)
