"""Reference attention and the flash-attn accuracy rule, shared by the CPU and GPU test suites and
the benchmark's output check."""

from __future__ import annotations

import math

import torch


def keep_mask(seqlen_q: int, seqlen_k: int, causal: bool, window_size=(-1, -1),
              top_left: bool = False, device=None) -> torch.Tensor:
    """(Sq, Sk) bool: which (query, key) pairs attend, flash-attn conventions."""
    left, right = window_size
    if causal:
        right = 0
    i = torch.arange(seqlen_q, device=device)[:, None] + (0 if top_left else seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k, device=device)[None, :]
    keep = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if right >= 0:
        keep &= j <= i + right
    if left >= 0:
        keep &= j >= i - left
    return keep


def attention_ref(q, k, v, *, causal=False, window_size=(-1, -1), softcap=0.0, scale=None,
                  top_left=False, upcast=True, keep=None):
    """Plain PyTorch attention on (B, H, S, D) tensors; returns (out, lse).

    upcast=True computes in float64 (the reference); upcast=False computes in the inputs' precision
    the way a straightforward PyTorch implementation would (scores and P@V in the input dtype,
    softmax in fp32), which sets the error budget of the flash-attn rule. Fully masked rows give 0
    and lse -inf.
    """
    dtype = q.dtype
    if upcast:
        q, k, v = q.double(), k.double(), v.double()
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(Hq // Hkv, dim=1)
    v = v.repeat_interleave(Hq // Hkv, dim=1)
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    s = torch.matmul(q * scale if not upcast else q, k.transpose(-1, -2))
    if upcast:
        s = s * scale
    s = s.float() if not upcast else s
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if keep is None:
        keep = keep_mask(Sq, Sk, causal, window_size, top_left, device=q.device)
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    if not upcast:
        p = p.to(dtype)
    out = torch.matmul(p, v)
    return out.to(dtype) if not upcast else out, lse


def random_inputs(*shapes, dtype: torch.dtype, device="cpu", seed: int = 0, mults=None,
                  requires_grad: bool = False) -> list[torch.Tensor]:
    """Fresh N(0, 1) tensors of the given shapes (never zeros), drawn in fp32 from one seeded
    generator on `device` and rounded to `dtype`; mults[i] scales the i-th (e.g. q, so that
    softcapped scores reach tanh's bend). The one input maker of the CPU and GPU suites."""
    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for i, shape in enumerate(shapes):
        t = torch.randn(tuple(shape), generator=g, device=device, dtype=torch.float32)
        if mults is not None and mults[i] != 1.0:
            t = t * mults[i]
        t = t.to(dtype)
        out.append(t.requires_grad_(True) if requires_grad else t)
    return out


def check_grads(name: str, fn, inputs, dout: torch.Tensor, grads, factor: float = 3.0,
                atol: float = 1e-5, names=("dq", "dk", "dv")) -> dict[str, tuple[float, float]]:
    """The flash-attn gradient rule for `grads` (the kernel's gradients of `inputs`).

    fn(*tensors, upcast) -> output, for attention_ref-like functions. The reference runs on float64
    leaves (its gradients are not rounded to the input dtype), the yardstick on same-precision
    leaves; each gradient must satisfy max|g - g64| <= factor * max|g_torch - g64| + atol.
    Returns {name: (err, torch_err)}."""
    leaves64 = [t.detach().double().requires_grad_(True) for t in inputs]
    ref_g = torch.autograd.grad(fn(*leaves64, upcast=True), leaves64, dout.double())
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    pt_g = torch.autograd.grad(fn(*leaves, upcast=False), leaves, dout)
    errs = {}
    for n, g, r, p in zip(names, grads, ref_g, pt_g):
        errs[n] = assert_flash_rule(f"{name}/{n}", g, r, p, factor, atol)
    return errs


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def assert_flash_rule(name: str, out: torch.Tensor, ref: torch.Tensor, out_pt: torch.Tensor,
                      factor: float, atol: float = 1e-5) -> tuple[float, float]:
    """max|out - ref| <= factor * max|out_pt - ref| + atol, NaN/inf checked on their own.
    Returns (err, pt_err) for summaries."""
    bad = ~torch.isfinite(out)
    if bad.any():
        idx = bad.nonzero()[:5].tolist()
        raise AssertionError(f"{name}: {int(bad.sum())} non-finite values, first at {idx}")
    err, pt_err = max_err(out, ref), max_err(out_pt, ref)
    if err > factor * pt_err + atol:
        diff = (out.double() - ref.double()).abs().flatten()
        worst = diff.topk(min(5, diff.numel()))
        where = [tuple(int(x) for x in torch.unravel_index(torch.tensor(i), out.shape))
                 for i in worst.indices.tolist()]
        raise AssertionError(
            f"{name}: max error {err:.3e} > {factor} x PyTorch-same-precision error {pt_err:.3e} "
            f"+ {atol:g}; worst at {where}: {worst.values.tolist()}")
    return err, pt_err


def assert_lse_close(name: str, lse: torch.Tensor, ref: torch.Tensor, rtol=1e-4, atol=1e-4) -> None:
    """LSE in fp32: -inf exactly where the reference is -inf, close elsewhere."""
    ref = ref.to(lse.device)
    ninf_ref, ninf = torch.isneginf(ref), torch.isneginf(lse)
    if not torch.equal(ninf_ref, ninf):
        raise AssertionError(f"{name}: lse is -inf at {int(ninf.sum())} places, reference at "
                             f"{int(ninf_ref.sum())}")
    if torch.isnan(lse).any():
        raise AssertionError(f"{name}: lse has NaN")
    fin = ~ninf_ref
    torch.testing.assert_close(lse[fin].double(), ref[fin].double(), rtol=rtol, atol=atol,
                               msg=lambda m: f"{name}: lse mismatch: {m}")
