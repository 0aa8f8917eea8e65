"""Shared shapes and inputs for the CPU kernel tests: small, odd, fixed-seed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from attngen.spec import KernelSpec

GENERATED = Path(__file__).resolve().parents[2] / "generated"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
B, HKV = 2, 2


def kernel_body(path: Path) -> str:
    """A generated module without its stamp (header comments, URI, target): what runs."""
    lines = [ln for ln in path.read_text().splitlines()
             if not ln.startswith("#") and not ln.startswith(("URI = ", "KERNEL_SPEC = "))]
    return "\n".join(lines)


def built_kernels(family: str, varlen: bool | None = None) -> list[tuple[KernelSpec, Path]]:
    """Every generated kernel of a family, one per distinct kernel body: targets that render the
    same code today (sm80/sm90 of the FA2 family) are checked to be identical and run once."""
    manifest = json.loads((GENERATED / "manifest.json").read_text())["kernels"]
    out, seen = [], {}
    for uri, ent in sorted(manifest.items()):
        spec = KernelSpec(**ent["kernel_spec"])
        if spec.family != family or (varlen is not None and spec.varlen != varlen):
            continue
        path = GENERATED / ent["file"]
        body = kernel_body(path)
        twin = spec.replace(target="sm80")
        if twin in seen and seen[twin] == body:
            continue  # same code as its sm80 twin, which runs
        seen[spec] = body
        out.append((spec, path))
    return out


def twin_kernels(family: str, varlen: bool | None = None) -> list[tuple[KernelSpec, Path, Path]]:
    """(spec, path, path of its sm80 twin) for every generated kernel that built_kernels() skipped
    because its code equals its sm80 twin's: each still runs once, and must match its twin bitwise."""
    manifest = json.loads((GENERATED / "manifest.json").read_text())["kernels"]
    run = {s: p for s, p in built_kernels(family, varlen)}
    out = []
    for uri, ent in sorted(manifest.items()):
        spec = KernelSpec(**ent["kernel_spec"])
        if spec.family != family or (varlen is not None and spec.varlen != varlen) or spec in run:
            continue
        out.append((spec, GENERATED / ent["file"], run[spec.replace(target="sm80")]))
    return out


@dataclass(frozen=True)
class Case:
    sq: int
    sk: int
    window: tuple[int, int] = (-1, -1)  # flash-attn convention
    causal: bool = False
    top_left: bool = False
    softcap: float = 0.0

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


def make_qkv(spec: KernelSpec, case: Case, seed: int, requires_grad: bool = False):
    """Fresh random (never zero) inputs; q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D)."""
    g = torch.Generator().manual_seed(seed)
    dt = DTYPES[spec.dtype]
    hq = HKV * spec.gqa_ratio
    q = torch.randn(B, hq, case.sq, spec.head_dim_qk, generator=g).to(dt)
    k = torch.randn(B, HKV, case.sk, spec.head_dim_qk, generator=g).to(dt)
    v = torch.randn(B, HKV, case.sk, spec.head_dim_v, generator=g).to(dt)
    if requires_grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v
