"""Benchmark cases and FLOP counting (no GPU, no providers): what `attngen bench` measures.

FLOPs: forward = 2 * (D_qk + D_v) * B * Hq * pairs, where pairs is Sq * Sk for a full mask, half of
it for a causal mask (the usual convention), and the exact count of attended (query, key) pairs for
sliding-window and document masks; fwd+bwd = 3.5 x forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MODES = ("fwd", "fwdbwd")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
FWDBWD_FLOP_FACTOR = 3.5


@dataclass(frozen=True)
class Case:
    """One benchmark shape: square sequences (Sq = Sk = seqlen), Dqk = Dv = head_dim. The names
    match the rows of the H200 anchors (the head-dim cases after causal-hd64-4k have none yet)."""

    name: str
    batch: int
    heads_q: int
    heads_kv: int
    seqlen: int
    head_dim: int
    causal: bool = False
    window: int = -1  # keys each query sees, itself included (with causal); -1 = unbounded
    docs: int = 0  # > 0: `docs` equal-length documents packed into each sequence

    @property
    def window_size(self) -> tuple[int, int]:
        """flash-attn's (left, right) for attngen.attention."""
        return (self.window - 1, 0) if self.window > 0 else (-1, -1)

    @property
    def doc_lens(self) -> tuple[int, ...]:
        if not self.docs:
            return (self.seqlen,)
        base, extra = divmod(self.seqlen, self.docs)
        return tuple(base + (i < extra) for i in range(self.docs))

    def describe(self) -> dict:
        return {"B": self.batch, "H": self.heads_q, "Hkv": self.heads_kv, "N": self.seqlen,
                "D": self.head_dim, "causal": self.causal, "window": self.window, "docs": self.docs}


CASES: tuple[Case, ...] = (
    Case("full", 4, 16, 16, 4096, 128),
    Case("causal", 4, 16, 16, 4096, 128, causal=True),
    Case("causal-16k", 1, 16, 16, 16384, 128, causal=True),
    Case("gqa4-causal-8k", 1, 32, 8, 8192, 128, causal=True),
    Case("swa1024-8k", 1, 32, 8, 8192, 128, causal=True, window=1024),
    Case("docs8-causal-8k", 1, 32, 8, 8192, 128, causal=True, docs=8),
    Case("causal-hd64-4k", 4, 32, 32, 4096, 64, causal=True),
    Case("causal-hd256-4k", 2, 16, 16, 4096, 256, causal=True),
    Case("causal-hd192-4k", 4, 16, 16, 4096, 192, causal=True),
    Case("causal-hd96-4k", 4, 32, 32, 4096, 96, causal=True),
    Case("causal-hd80-4k", 4, 32, 32, 4096, 80, causal=True),
)
CASES_BY_NAME = {c.name: c for c in CASES}


def attended_pairs(seqlen_q: int, seqlen_k: int, causal: bool = False,
                   window_size: tuple[int, int] = (-1, -1), top_left: bool = False) -> int:
    """Exact number of (query, key) pairs a mask keeps, flash-attn conventions: query i sees keys
    j with i + off - left <= j <= i + off + right, off = Sk - Sq (bottom-right) or 0 (top-left),
    a side of -1 unbounded, causal forcing right = 0."""
    left, right = window_size
    if causal:
        right = 0
    off = 0 if top_left else seqlen_k - seqlen_q
    total = 0
    for i in range(seqlen_q):
        lo = 0 if left < 0 else max(0, i + off - left)
        hi = seqlen_k - 1 if right < 0 else min(seqlen_k - 1, i + off + right)
        if hi >= lo:
            total += hi - lo + 1
    return total


def forward_flops(case: Case) -> float:
    """Forward FLOPs: 2 * (Dqk + Dv) per (query, key) pair and head; pairs = Sq*Sk (full), half of
    it (plain causal), the exact count (sliding window, documents)."""
    per_pair = 4 * case.head_dim * case.batch * case.heads_q
    if case.docs or case.window > 0:
        pairs = sum(attended_pairs(n, n, case.causal, case.window_size) for n in case.doc_lens)
        return float(per_pair * pairs)
    full = per_pair * case.seqlen * case.seqlen
    return full / 2 if case.causal else float(full)


def case_flops(case: Case, mode: str) -> float:
    return forward_flops(case) * (FWDBWD_FLOP_FACTOR if mode == "fwdbwd" else 1.0)
