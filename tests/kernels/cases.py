"""Shared shapes and inputs for the CPU kernel tests: small, odd, fixed-seed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from attngen.problem import Problem
from attngen.spec import KernelSpec

GENERATED = Path(__file__).resolve().parents[2] / "generated"
B, HKV = 2, 2


def kernel_body(path: Path) -> str:
    """A generated module without its stamp (header comments, URI, KERNEL_SPEC): what runs."""
    lines = [ln for ln in path.read_text().splitlines()
             if not ln.startswith("#") and not ln.startswith(("URI = ", "KERNEL_SPEC = "))]
    return "\n".join(lines)


def built_kernels(family: str, varlen: bool | None = None) -> list[tuple[KernelSpec, Path]]:
    """Every generated kernel of a family, one per distinct kernel body: a kernel whose code is
    byte-identical to one already listed for the same dtype would only rerun the same code, so it
    is not listed. The bodies themselves are compared here (stamp lines left out), so a kernel is
    skipped only while its code really is a twin's (no other test checks the twins), and a
    target that gets code of its own is listed automatically."""
    manifest = json.loads((GENERATED / "manifest.json").read_text())["kernels"]
    out, seen = [], set()
    for uri, ent in sorted(manifest.items()):
        spec = KernelSpec(**ent["kernel_spec"])
        if spec.family != family or (varlen is not None and spec.varlen != varlen):
            continue
        if spec.has_expr:  # expression kernels: tests/kernels/test_expr.py runs each through its spec
            continue
        path = GENERATED / ent["file"]
        body = (spec.dtype, kernel_body(path))  # the same code runs on other inputs per dtype
        if body in seen:
            continue
        seen.add(body)
        out.append((spec, path))
    return out


@dataclass(frozen=True)
class Case:
    sq: int
    sk: int
    window: tuple[int, int] = (-1, -1)  # flash-attn convention
    causal: bool = False
    top_left: bool = False
    softcap: float = 0.0

    def problem(self, spec: KernelSpec) -> Problem:
        """The case on a kernel's head dims, dtype and GQA ratio: B x (HKV x gqa) query heads."""
        return Problem(B, HKV * spec.gqa_ratio, HKV, self.sq, self.sk, spec.head_dim_qk, spec.head_dim_v,
                       spec.dtype, self.causal, self.window, self.softcap, top_left=self.top_left)

    @property
    def name(self) -> str:
        w = f"_w{self.window[0]}x{self.window[1]}" if self.window != (-1, -1) else ""
        return (f"sq{self.sq}_sk{self.sk}{'_causal' if self.causal else ''}{w}"
                f"{'_tl' if self.top_left else ''}{f'_cap{self.softcap:g}' if self.softcap else ''}")


def cases_for(spec: KernelSpec) -> list[Case]:
    """Seqlens from {1, 17, 113, 203}, Sq != Sk both ways, the masks the kernel's structure allows."""
    cap = 30.0 if spec.softcap else 0.0
    if spec.mask == "none":
        return [Case(113, 203, softcap=cap), Case(203, 113, softcap=cap), Case(1, 17, softcap=cap)]
    if spec.mask == "causal":
        return [Case(113, 203, causal=True, softcap=cap), Case(203, 113, causal=True, softcap=cap),
                Case(17, 113, causal=True, top_left=True, softcap=cap), Case(1, 17, causal=True, softcap=cap)]
    return [Case(113, 203, window=(31, 0), causal=True, softcap=cap),
            Case(203, 113, window=(20, 7), softcap=cap),
            Case(17, 203, window=(-1, 5), softcap=cap),
            Case(1, 17, window=(4, 0), causal=True, softcap=cap)]


def make_qkv(spec: KernelSpec, case: Case, seed: int):
    """q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D) for a kernel and a case (Problem.make_inputs)."""
    return case.problem(spec).make_inputs(seed=seed)
