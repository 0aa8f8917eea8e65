"""The flash-attn accuracy rule (and its gradient form), shared by the CPU and GPU test suites, the
tuner's objective and the benchmark's output check. The reference and the inputs it is checked on
are attngen.problem's."""

from __future__ import annotations

import torch


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
        if g is None:  # a gradient the caller checks on its own
            continue
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
