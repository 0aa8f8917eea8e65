"""Shapes, inputs, chunked references and summary records shared by the GPU tests.

The references are attngen.problem's: `chunked_ref` runs Problem.reference over query-row chunks so
that GPU-sized cases stay within bounded memory (the float64 scores of an 8192 x 8192 case are
512 MiB per head).
upcast=True gives the float64 answer for the given fp16/bf16 inputs; upcast=False plain PyTorch in
the inputs' precision, the yardstick of the flash-attn rule.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from attngen.problem import Problem, random_inputs

BF16, FP16 = torch.bfloat16, torch.float16
DEVICE = "cuda"
CHUNK_BYTES = 512 << 20  # one float64 score-sized temporary per chunk


@dataclass(frozen=True)
class Shape:
    dtype: torch.dtype
    B: int
    Hq: int
    Hkv: int
    Sq: int
    Sk: int
    D: int
    causal: bool = False
    window: tuple[int, int] = (-1, -1)  # flash-attn window_size
    softcap: float = 0.0
    layout: str = "bhsd"
    q_mult: float = 1.0  # scales q, so that softcapped scores reach tanh's bend

    @property
    def id(self) -> str:
        mask = "causal" if self.causal else "full"
        if self.window != (-1, -1):
            mask += f"-win{self.window[0]}_{self.window[1]}"
        cap = f"-cap{self.softcap:g}" if self.softcap else ""
        lay = "-bshd" if self.layout == "bshd" else ""
        return (f"{'bf16' if self.dtype == BF16 else 'fp16'}-b{self.B}-h{self.Hq}_{self.Hkv}"
                f"-q{self.Sq}-k{self.Sk}-d{self.D}-{mask}{cap}{lay}")

    @property
    def mask_kwargs(self) -> dict:
        return {"causal": self.causal, "window_size": self.window, "softcap": self.softcap}

    def record(self, kind: str, **values) -> dict:
        """A summary row (conftest writes them to $ATTNGEN_GPU_SUMMARY)."""
        return {"kind": kind, "id": self.id, "dtype": str(self.dtype).removeprefix("torch."),
                "B": self.B, "Hq": self.Hq, "Hkv": self.Hkv, "Sq": self.Sq, "Sk": self.Sk,
                "D": self.D, "causal": self.causal, "window": list(self.window),
                "softcap": self.softcap, "layout": self.layout, **values}


def make_inputs(s: Shape, salt: str = "") -> tuple[torch.Tensor, ...]:
    """Fresh N(0, 1) q, k, v, dout (B, H, S, D) in s.dtype, seeded from the case id
    (attngen.problem.random_inputs, the suites' one input maker)."""
    seed = zlib.crc32((salt + s.id).encode())
    return tuple(random_inputs((s.B, s.Hq, s.Sq, s.D), (s.B, s.Hkv, s.Sk, s.D), (s.B, s.Hkv, s.Sk, s.D),
                               (s.B, s.Hq, s.Sq, s.D), dtype=s.dtype, device=DEVICE, seed=seed,
                               mults=(s.q_mult, 1.0, 1.0, 1.0)))


def chunked_ref(q, k, v, *, upcast: bool, causal=False, window_size=(-1, -1), softcap=0.0,
                scale=None, top_left=False) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of the (B, H, S, D) inputs' Problem.reference, computed over chunks of query rows."""
    (B, Hq, Sq, D), (_, Hkv, Sk, _), Dv = q.shape, k.shape, v.shape[-1]
    problem = Problem(B, Hq, Hkv, Sq, Sk, D, Dv, causal=causal, window=tuple(window_size), softcap=softcap,
                      scale=scale, top_left=top_left)
    return problem.reference(q, k, v, upcast=upcast, max_scores=CHUNK_BYTES // 8)
