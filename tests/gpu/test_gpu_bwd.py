"""Backward of `attngen.attention` at GPU sizes: dQ, dK, dV against float64 autograd of the
reference (float64 leaves, so the reference gradients are not rounded to the input dtype), with the
flash-attn gradient rule max|g - g64| <= 3 * max|g_torch - g64| + 1e-5, g_torch from plain PyTorch
in the inputs' precision."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest
import torch

import attngen
from attngen.problem import attention_ref
from attngen.testing import check_grads

from .common import BF16, FP16, Shape, make_inputs

pytestmark = pytest.mark.gpu

FACTOR, ATOL = 3.0, 1e-5  # as the CPU backward tests (tests/kernels/test_bwd.py)
GRADS = ("dq", "dk", "dv")

# Sizes up to 4096 x 4096: the float64 autograd graph holds a few (B, Hq, Sq, Sk) tensors.
CASES = [
    Shape(BF16, 1, 8, 2, 4096, 4096, 128, causal=True),
    Shape(FP16, 1, 8, 8, 1023, 4096, 64),
    Shape(BF16, 1, 8, 2, 4096, 4096, 128, causal=True, window=(1023, 0)),
    Shape(FP16, 1, 8, 4, 4096, 1023, 256, causal=True, softcap=30.0, q_mult=4.0),
    Shape(BF16, 2, 8, 8, 1023, 1023, 80),
]


class _Sm90Run:
    """A forced sm90 backward of shape `c`: inputs, the runtime's forward (out, LSE), the backward
    KernelSpec and mask values; skips off Hopper."""

    def __init__(self, c: Shape, salt: str):
        from attngen.kernels.common import MaskArgs, mask_kind
        from attngen.runtime import loader
        from attngen.runtime.dispatch import native_target
        from attngen.spec import KernelSpec

        if native_target(torch.device("cuda")) != "sm90":
            pytest.skip("the TMA and Gluon backward kernels are the sm90 family's")
        self.t0 = time.perf_counter()
        q, k, v, self.dout = make_inputs(c, salt=salt)
        self.inputs = (q, k, v)
        self.out, self.lse = attngen.attention(q, k, v, return_lse=True, **c.mask_kwargs)
        mask, wl, wr = mask_kind(c.causal, c.window)
        self.spec = KernelSpec("bwd", "bf16" if c.dtype == BF16 else "fp16", "sm90", c.D, c.D, c.Hq // c.Hkv,
                               mask, softcap=c.softcap > 0)
        self.args = MaskArgs(scale=1 / math.sqrt(c.D), softcap=c.softcap, window_left=wl, window_right=wr,
                             align_top_left=False)
        self.module = loader.load(self.spec)

    def kernel_names(self, cfg) -> list[str]:
        from attngen.families.bwd import bwd_launches

        q, k, v = self.inputs
        return [la.fn.__name__ for la in bwd_launches(
            self.module, self.spec, q, k, v, self.out, self.dout, self.lse, torch.empty_like(self.lse),
            torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), self.args, cfg, False)]

    def backward(self, cfg, deterministic: bool) -> tuple:
        """(dq, dk, dv) through the launcher (outputs poisoned first)."""
        from attngen.families.bwd import attn_bwd

        grads = tuple(torch.full_like(t, float("nan")) for t in self.inputs)
        attn_bwd(self.module, self.spec, *self.inputs, self.out, self.dout, self.lse, *grads, self.args, cfg,
                 deterministic=deterministic)
        torch.cuda.synchronize()
        return grads


def _check_and_record(c: Shape, kind: str, inputs, dout, grads, gpu_records, t0: float) -> None:
    """The gradient rule on grads of a launcher-run backward, with its summary record."""
    rec = c.record(kind, passed=False, error=None)
    gpu_records.append(rec)
    try:
        errs = check_grads(c.id, lambda *t, upcast: attention_ref(*t, upcast=upcast, **c.mask_kwargs)[0],
                           inputs, dout, grads, FACTOR, ATOL)
    finally:
        rec.update(seconds=round(time.perf_counter() - t0, 2))
    rec.update(ratio_to_torch=max((e / pe if pe > 0 else 0.0) for e, pe in errs.values()), passed=True)


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_backward_matches_float64_reference(c: Shape, gpu_records):
    t0 = time.perf_counter()
    q, k, v, dout = make_inputs(c, salt="bwd")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = attngen.attention(*leaves, **c.mask_kwargs)
    assert out.requires_grad, "attngen.attention returned an output without a gradient"
    rec = c.record("bwd", passed=False, error=None)
    gpu_records.append(rec)
    try:
        grads = torch.autograd.grad(out, leaves, dout)
        torch.cuda.synchronize()
    except Exception as exc:
        rec.update(error=f"{type(exc).__name__}: {exc}"[:500],
                   seconds=round(time.perf_counter() - t0, 2))
        raise

    try:
        errs = check_grads(c.id, lambda *t, upcast: attention_ref(*t, upcast=upcast, **c.mask_kwargs)[0],
                           (q, k, v), dout, grads, FACTOR, ATOL)
    finally:
        rec.update(seconds=round(time.perf_counter() - t0, 2))
    rec.update(err={n: e for n, (e, _) in errs.items()},
               torch_err={n: pe for n, (_, pe) in errs.items()},
               ratio_to_torch=max((e / pe if pe > 0 else 0.0) for e, pe in errs.values()))
    rec["passed"] = True


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("atomic,split,regs", [(False, False, False), (True, False, False), (False, True, False),
                                               (False, False, True)],
                         ids=["dq-pass", "dq-reduce-add", "split-dkdv", "dq-regs"])
def test_tma_backward_matches_float64_reference(c: Shape, atomic: bool, split: bool, regs: bool, gpu_records):
    """The sm90 TMA backward kernels (BwdConfig.tma: tiles through descriptors; with atomic_dq
    the dQ tiles by TMA reduce-add inside the dK/dV pass, else the TMA dQ pass; split_dkdv: dK and
    dV from two launches; dq_regs: the dQ pass's Q and dO held in registers), forced here whether
    or not the default table or the database picks them, with the same rule."""
    from attngen.configs import bwd_triton_fallback, check_bwd, default_bwd_config

    run = _Sm90Run(c, "bwd-tma")
    # the Triton kernels' config (the Gluon passes, the default where they exist, are tested below)
    cfg = dataclasses.replace(bwd_triton_fallback(default_bwd_config(run.spec)), atomic_dq=atomic, tma=True,
                              split_dkdv=split, dq_regs=regs)
    if atomic and c.D > 128:  # the default tiles and the fp32 dQ tile do not fit the shared memory together
        cfg = dataclasses.replace(cfg, block_m=32, block_n=64, num_warps=4, num_stages=2)
    assert check_bwd(run.spec, cfg) is None
    grads = run.backward(cfg, deterministic=False)
    kind = "bwd-tma" + ("-dq-reduce" if atomic else "") + ("-split" if split else "") + ("-dq-regs" if regs else "")
    _check_and_record(c, kind, run.inputs, run.dout, grads, gpu_records, run.t0)


# The warp-specialized Gluon dK/dV pass (BwdConfig.consumers; dense hd64 / hd128 without softcap):
# odd lengths both ways, GQA, a window, the key edge inside a consumer's 64 keys and past it.
WS_CASES = [
    Shape(BF16, 1, 8, 2, 1023, 1023, 128, causal=True),
    Shape(FP16, 2, 4, 4, 113, 203, 64, causal=True),
    Shape(BF16, 1, 4, 4, 203, 113, 128),
    Shape(FP16, 1, 8, 8, 1023, 4096, 128),
    Shape(BF16, 1, 8, 2, 4096, 4096, 128, causal=True, window=(1023, 0)),
    Shape(BF16, 1, 8, 8, 4096, 4096, 64, causal=True),
    Shape(BF16, 2, 4, 1, 2049, 2049, 128, window=(255, 17)),
]


@pytest.mark.parametrize("c", WS_CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("dkdv,dq", [(2, 0), (0, 2), (2, 2)], ids=["dkdv-ws", "dq-ws", "both-ws"])
def test_ws_backward_matches_float64_reference(c: Shape, dkdv: int, dq: int, gpu_records):
    """The Gluon dK/dV and dQ passes, forced (and checked to be the kernels that ran), with the
    rule above."""
    from attngen.configs import check_bwd, default_bwd_config

    run = _Sm90Run(c, "bwd-ws")
    cfg = dataclasses.replace(default_bwd_config(run.spec), tma=True, atomic_dq=False, split_dkdv=False,
                              dq_regs=False, consumers=0, dq_consumers=0)
    if dkdv:
        cfg = dataclasses.replace(cfg, block_m=64, block_n=128, num_warps=4, num_stages=2, consumers=dkdv)
    if dq:
        cfg = dataclasses.replace(cfg, dq_block_m=128, dq_block_n=64, dq_num_warps=4, dq_num_stages=2,
                                  dq_consumers=dq)
    assert check_bwd(run.spec, cfg) is None
    names = run.kernel_names(cfg)
    assert ("_attn_bwd_dkdv_ws" in names) == bool(dkdv) and ("_attn_bwd_dq_ws" in names) == bool(dq), names
    grads = run.backward(cfg, deterministic=True)
    _check_and_record(c, f"bwd-ws-dkdv{dkdv}-dq{dq}", run.inputs, run.dout, grads, gpu_records, run.t0)


def _ring_depths() -> list:
    """One config of the tuner's sm90 space (hd128, GQA 4, causal) for each ring depth of the two
    Gluon passes (num_stages, dq_num_stages) with and without roles: every depth the tuner may
    pick must finish and be right (dq_num_stages 1 deadlocked the dQ pass, 2026-12-04)."""
    from attngen import configs as space
    from attngen.configs import BwdConfig
    from attngen.spec import KernelSpec
    from attngen.tuning.sampling import ValidSpace

    spec = KernelSpec("bwd", "bf16", "sm90", 128, 128, 4, "causal")
    picked = {}
    for c in ValidSpace(spec, space.search_space(BwdConfig, "bwd", "sm90")).configs():
        if c["consumers"] and c["dq_consumers"]:
            picked.setdefault((c["roles"], c["num_stages"], c["dq_num_stages"]), BwdConfig(**c))
    return [picked[k] for k in sorted(picked)]


RING_DEPTHS = _ring_depths()


@pytest.mark.parametrize("cfg", RING_DEPTHS,
                         ids=[f"roles{int(c.roles)}-stages{c.num_stages}-dq_stages{c.dq_num_stages}" for c in RING_DEPTHS])
def test_ws_backward_every_ring_depth_of_the_space(cfg, gpu_records):
    c = Shape(BF16, 1, 8, 2, 1023, 1023, 128, causal=True)
    run = _Sm90Run(c, "bwd-ring")
    names = run.kernel_names(cfg)
    assert "_attn_bwd_dkdv_ws" in names and "_attn_bwd_dq_ws" in names, names
    grads = run.backward(cfg, deterministic=True)
    _check_and_record(c, f"bwd-ws-ring-r{int(cfg.roles)}-s{cfg.num_stages}-dqs{cfg.dq_num_stages}", run.inputs,
                      run.dout, grads, gpu_records, run.t0)


# BwdConfig.roles: the Gluon dK/dV pass with both consumers on the same 64 keys, one computing P^T
# and dV, the other dP^T, dS^T and dK -- the only Gluon dK/dV pass past hd128
ROLES_CASES = [
    Shape(BF16, 2, 4, 4, 1023, 1023, 256, causal=True),
    Shape(FP16, 1, 4, 2, 113, 203, 256, causal=True),
    Shape(BF16, 1, 4, 4, 203, 113, 256),
    Shape(FP16, 1, 4, 1, 2049, 2049, 256, window=(255, 17)),
    Shape(BF16, 1, 8, 2, 1023, 1023, 128, causal=True),
    Shape(FP16, 1, 4, 4, 203, 4096, 64),
]


@pytest.mark.parametrize("c", ROLES_CASES, ids=lambda c: c.id)
def test_ws_backward_roles_matches_float64_reference(c: Shape, gpu_records):
    """The Gluon dK/dV pass with split roles, forced (and checked to be the kernel that ran), with
    the rule above; the dQ pass is the default's (Triton's past hd128)."""
    from attngen.configs import check_bwd, default_bwd_config

    run = _Sm90Run(c, "bwd-roles")
    cfg = dataclasses.replace(default_bwd_config(run.spec), tma=True, atomic_dq=False, split_dkdv=False,
                              block_m=64, block_n=64, num_warps=4, num_stages=2, consumers=2, roles=True)
    assert check_bwd(run.spec, cfg) is None
    names = run.kernel_names(cfg)
    assert "_attn_bwd_dkdv_ws" in names and "_attn_bwd_dkdv_tma" not in names, names
    grads = run.backward(cfg, deterministic=True)
    _check_and_record(c, "bwd-ws-roles", run.inputs, run.dout, grads, gpu_records, run.t0)
