"""Benchmark cases and FLOP counting (no GPU, no providers): what `attngen bench` measures. Each
case is an attngen.problem.Problem (Case.problem), which counts the FLOPs.

FLOPs: forward = 2 * (D_qk + D_v) * B * Hq * pairs, where pairs is Sq * Sk for a full mask, half of
it for a causal mask (the usual convention), and the exact count of attended (query, key) pairs for
sliding-window and document masks; fwd+bwd = 3.5 x forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attngen.problem import Problem

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

    def problem(self, dtype: str = "bf16") -> Problem:
        """The attention problem: dense (B, H, S, D), or the batch's documents packed."""
        shape = dict(heads_q=self.heads_q, heads_kv=self.heads_kv, head_dim_qk=self.head_dim,
                     head_dim_v=self.head_dim, dtype=dtype, causal=self.causal, window=self.window_size)
        if self.docs:
            lens = self.doc_lens * self.batch
            return Problem.packed_documents(lens, lens, **shape)
        return Problem(batch=self.batch, seqlen_q=self.seqlen, seqlen_k=self.seqlen, **shape)

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


def forward_flops(case: Case) -> float:
    """Forward FLOPs: 2 * (Dqk + Dv) per (query, key) pair and head; pairs = Sq*Sk (full), half of
    it (plain causal), the exact count (sliding window, documents)."""
    return case.problem().flops(exact=False)


def case_flops(case: Case, mode: str) -> float:
    return forward_flops(case) * (FWDBWD_FLOP_FACTOR if mode == "fwdbwd" else 1.0)


def pick(arg: str | None, table: dict, what: str) -> list:
    """The values of `table` named in the comma-separated `arg` (all of them when it is empty); a
    ValueError names the unknown ones (every bench mode's --cases and --providers)."""
    if not arg:
        return list(table.values())
    names = [s.strip() for s in arg.split(",") if s.strip()]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(table)})")
    return [table[n] for n in names]


def mode_selection(args, cases, providers, mode: str, fail):
    """The cases and providers (None: all) a bf16 bench mode (decode, prefill-paged) is asked for by
    --cases / --providers / --dtype, or the exit code fail(message, code) gives a bad argument (2)
    or a machine without a GPU (1)."""
    try:
        picked = pick(args.cases, {c.name: c for c in cases}, "case")
        chosen = pick(args.providers, {n: n for n in providers}, "provider") if args.providers else None
    except ValueError as exc:
        return fail(str(exc), 2)
    if args.dtype != "bf16":
        return fail(f"{mode} rows are bf16 (--dtype bf16)", 2)
    if not torch.cuda.is_available():
        return fail("needs a CUDA GPU (torch.cuda.is_available() is False)", 1)
    return picked, chosen
