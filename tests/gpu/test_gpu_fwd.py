"""Forward correctness of `attngen.attention` at realistic sizes on the GPU (fp16 and bf16).

The flash-attn rule, against a float64 reference of the same inputs:
    max|out - ref64| <= 2 * max|torch_out - ref64| + 1e-5
where torch_out is plain PyTorch in the inputs' precision (attngen.problem, chunked over query rows
by tests/gpu/common.py). The logsumexp is checked against the float64 one (rtol = atol = 1e-4), rows
that see no key must give out = 0 and lse = -inf, and nothing may be NaN/inf otherwise.
"""

from __future__ import annotations

import time

import pytest
import torch

import attngen
from attngen.testing import assert_flash_rule, assert_lse_close, max_err

from .common import BF16, FP16, Shape, chunked_ref, make_inputs

pytestmark = pytest.mark.gpu

FACTOR, ATOL = 2.0, 1e-5  # the flash-attn rule
LSE_TOL = 1e-4

CASES = [
    # plain and causal, every head dim, GQA 1 and 4
    Shape(BF16, 2, 8, 8, 1023, 1023, 64),
    Shape(FP16, 2, 8, 2, 1023, 1023, 64, causal=True),
    Shape(BF16, 1, 8, 2, 4096, 4096, 128, causal=True),
    Shape(FP16, 1, 8, 8, 4096, 4096, 128),
    Shape(BF16, 1, 8, 8, 8192, 8192, 128, causal=True),
    Shape(FP16, 1, 4, 1, 8192, 8192, 64, causal=True),
    Shape(FP16, 1, 4, 4, 8192, 8192, 256, causal=True),
    Shape(BF16, 1, 16, 4, 4096, 4096, 80, causal=True),
    Shape(BF16, 1, 8, 2, 4096, 4096, 192, causal=True),
    Shape(FP16, 1, 4, 4, 1023, 2048, 192),
    # Sq != Sk (bottom-right diagonal; Sq > Sk with causal leaves rows that see no key)
    Shape(BF16, 1, 8, 2, 1023, 8192, 128, causal=True),
    Shape(FP16, 1, 8, 8, 8192, 1023, 80),
    Shape(BF16, 2, 8, 8, 4096, 1023, 64, causal=True),
    Shape(FP16, 1, 8, 2, 4096, 8192, 80, causal=True),
    # sliding windows
    Shape(BF16, 1, 8, 2, 8192, 8192, 128, causal=True, window=(1023, 0)),
    Shape(FP16, 2, 8, 8, 4096, 4096, 64, window=(128, 128)),
    Shape(BF16, 1, 8, 8, 4096, 8192, 80, window=(-1, 256)),
    Shape(FP16, 1, 8, 2, 4096, 1023, 128, causal=True, window=(511, 0)),
    Shape(FP16, 1, 4, 4, 1023, 4096, 64, window=(0, 0)),
    # softcap (q scaled so that scores reach tanh's bend)
    Shape(BF16, 1, 8, 2, 4096, 4096, 256, causal=True, softcap=50.0, q_mult=4.0),
    Shape(FP16, 1, 8, 8, 1023, 4096, 256, softcap=30.0, q_mult=4.0),
    Shape(BF16, 1, 8, 2, 8192, 8192, 256, causal=True, window=(1023, 0), softcap=50.0, q_mult=4.0),
    Shape(BF16, 1, 8, 8, 1023, 1023, 80, causal=True, softcap=20.0, q_mult=4.0),
    # flash-attn layout
    Shape(BF16, 2, 8, 2, 4096, 4096, 128, causal=True, layout="bshd"),
]


def run_forward(c: Shape, q, k, v):
    """attngen.attention in the case's layout; out (B, Hq, Sq, D) and lse either way."""
    if c.layout == "bshd":
        out, lse = attngen.attention(*(t.transpose(1, 2).contiguous() for t in (q, k, v)),
                                     layout="bshd", return_lse=True, **c.mask_kwargs)
        assert out.shape == (c.B, c.Sq, c.Hq, c.D), f"{c.id}: bshd out shape {tuple(out.shape)}"
        return out.transpose(1, 2), lse
    return attngen.attention(q, k, v, return_lse=True, **c.mask_kwargs)


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_forward_matches_float64_reference(c: Shape, gpu_records):
    t0 = time.perf_counter()
    q, k, v, _ = make_inputs(c)
    rec = c.record("fwd", passed=False, error=None)
    gpu_records.append(rec)
    try:
        out, lse = run_forward(c, q, k, v)
        torch.cuda.synchronize()
    except Exception as exc:
        rec.update(error=f"{type(exc).__name__}: {exc}"[:500],
                   seconds=round(time.perf_counter() - t0, 2))
        raise
    assert out.dtype == c.dtype and out.shape == (c.B, c.Hq, c.Sq, c.D), (out.dtype, out.shape)
    assert lse.dtype == torch.float32 and lse.shape == (c.B, c.Hq, c.Sq), (lse.dtype, lse.shape)

    ref, ref_lse = chunked_ref(q, k, v, upcast=True, **c.mask_kwargs)
    torch_out, _ = chunked_ref(q, k, v, upcast=False, **c.mask_kwargs)
    assert torch.isfinite(torch_out).all(), f"{c.id}: the same-precision reference went non-finite"

    empty = torch.isneginf(ref_lse)  # rows that see no key
    err, torch_err = max_err(out, ref), max_err(torch_out, ref)
    lse_rel = ((lse.double() - ref_lse).abs() / ref_lse.abs().clamp_min(1.0))[~empty]
    rec.update(err=err, torch_err=torch_err, bound=FACTOR * torch_err + ATOL,
               ratio_to_torch=err / torch_err if torch_err > 0 else None,
               lse_rel_err=float(lse_rel.max()) if lse_rel.numel() else 0.0,
               empty_rows=int(empty[0, 0].sum()), seconds=round(time.perf_counter() - t0, 2))

    assert_flash_rule(c.id, out, ref, torch_out, FACTOR, ATOL)
    assert_lse_close(c.id, lse, ref_lse, rtol=LSE_TOL, atol=LSE_TOL)
    if bool(empty.any()):
        assert float(out.masked_select(empty[..., None]).abs().max()) == 0.0, \
            f"{c.id}: rows that see no key must give out = 0"
    rec["passed"] = True


KNOB_CASES = [c for c in CASES if c.layout == "bhsd"][::3]
KNOBS = [dict(persistent=1), dict(persistent=2), dict(q_regs=True), dict(q_regs=False, maxnreg=168),
         # the warp-specialized Gluon forward's other rings (its default, 128-key blocks x 2, serves
         # test_forward_matches_float64_reference wherever it exists)
         dict(consumers=2, block_m=128, block_n=64, num_stages=4, q_regs=False),
         dict(consumers=2, block_m=128, block_n=128, num_stages=1, q_regs=False),
         # two mirrored query tiles per program (ring positions and Q barrier phases run on
         # across the tiles); 64-key blocks for hd192 / hd256
         dict(consumers=2, block_m=128, block_n=128, num_stages=2, q_regs=False, pair_tiles=True),
         dict(consumers=2, block_m=128, block_n=64, num_stages=2, q_regs=False, pair_tiles=True),
         # one consumer warp group per program (two programs per SM), alone and paired
         dict(consumers=1, block_m=64, block_n=64, num_stages=2, q_regs=False),
         dict(consumers=1, block_m=64, block_n=64, num_stages=2, q_regs=False, pair_tiles=True)]
# (the Gluon kernel's persistent grid exists for packed documents only: test_gpu_determinism_varlen)


def knob_config(c: Shape, knobs: dict):
    """The sm90 KernelSpec of case `c` and the TMA forward config with `knobs` forced onto its
    default tiles; pure data (no GPU needed), so the parametrization below can filter on it."""
    import dataclasses

    from attngen.kernels.common import mask_kind
    from attngen.spec import KernelSpec
    from attngen.configs import default_fwd_config, triton_fallback

    mask, _, _ = mask_kind(c.causal, c.window)
    spec = KernelSpec("fwd", "bf16" if c.dtype == BF16 else "fp16", "sm90", c.D, c.D, c.Hq // c.Hkv, mask,
                      softcap=c.softcap > 0)
    cfg = dataclasses.replace(triton_fallback(default_fwd_config(spec, "cuda", c.Sq), spec), tma=True,
                              warp_specialize=False, **knobs)
    return spec, cfg


def _knob_id(knobs: dict) -> str:
    return "-".join(f"{k}{int(v)}" for k, v in knobs.items())


def _valid_knob_cases():
    """(case, knobs) pairs whose config the validity filter accepts: the Gluon knobs exist for some
    head dims only (e.g. 128-key rings do not fit hd256's shared memory), so those pairs are not
    generated rather than skipped. The Triton knobs must be valid on every case (asserted in the
    test)."""
    from attngen.configs import check_fwd

    pairs = []
    for knobs in KNOBS:
        valid = [c for c in KNOB_CASES
                 if not knobs.get("consumers") or check_fwd(*knob_config(c, knobs)) is None]
        # a knob set that no case accepts would vanish from the suite unnoticed: fail collection
        assert valid, f"no case of KNOB_CASES accepts {knobs}"
        pairs += [pytest.param(c, knobs, id=f"{c.id}-{_knob_id(knobs)}") for c in valid]
    # one consumer past hd128 (KNOB_CASES has none): its launch register cap depends on the head
    # dim (space.ws_fwd_maxnreg)
    one = dict(consumers=1, block_m=64, block_n=64, num_warps=4, num_stages=2, q_regs=False, lazy_rescale=False)
    for d in (192, 256):
        c = next(c for c in CASES if c.D == d and c.layout == "bhsd" and not c.softcap and c.window == (-1, -1))
        assert check_fwd(*knob_config(c, one)) is None, c.id
        pairs.append(pytest.param(c, one, id=f"{c.id}-{_knob_id(one)}"))
    return pairs


@pytest.mark.parametrize(("c", "knobs"), _valid_knob_cases())
def test_tma_knobs_forward_matches_float64_reference(c: Shape, knobs: dict, gpu_records):
    """The sm90 TMA forward with its knobs (FwdConfig.persistent: programs per SM; q_regs: the Q
    tile in registers; maxnreg: a register cap) forced onto the default tiles, whether or not the
    default table picks them, with the same rule (the persistent programs cover every tile exactly
    once: a missed or doubled tile shows as a wrong row)."""
    import math

    from attngen.kernels.common import MaskArgs, mask_kind
    from attngen.families.fwd import attn_fwd
    from attngen.runtime import loader
    from attngen.runtime.dispatch import native_target
    from attngen.configs import check_fwd

    if native_target(torch.device("cuda")) != "sm90":
        pytest.skip("the TMA forward is the sm90 family's")
    t0 = time.perf_counter()
    q, k, v, _ = make_inputs(c, salt="fwd-knobs")
    _, wl, wr = mask_kind(c.causal, c.window)
    spec, cfg = knob_config(c, knobs)
    assert check_fwd(spec, cfg) is None, check_fwd(spec, cfg)
    args = MaskArgs(scale=1 / math.sqrt(c.D), softcap=c.softcap, window_left=wl, window_right=wr,
                    align_top_left=False)
    out = torch.full((c.B, c.Hq, c.Sq, c.D), float("nan"), dtype=c.dtype, device="cuda")
    lse = torch.full((c.B, c.Hq, c.Sq), float("nan"), device="cuda")
    attn_fwd(loader.load(spec), spec, q, k, v, out, lse, args, cfg)
    torch.cuda.synchronize()
    rec = c.record("fwd-" + _knob_id(knobs), passed=False, error=None)
    gpu_records.append(rec)
    ref, ref_lse = chunked_ref(q, k, v, upcast=True, **c.mask_kwargs)
    torch_out, _ = chunked_ref(q, k, v, upcast=False, **c.mask_kwargs)
    err, torch_err = max_err(out, ref), max_err(torch_out, ref)
    rec.update(err=err, torch_err=torch_err, ratio_to_torch=err / torch_err if torch_err > 0 else None,
               seconds=round(time.perf_counter() - t0, 2))
    assert_flash_rule(c.id, out, ref, torch_out, FACTOR, ATOL)
    assert_lse_close(c.id, lse, ref_lse, rtol=LSE_TOL, atol=LSE_TOL)
    rec["passed"] = True
