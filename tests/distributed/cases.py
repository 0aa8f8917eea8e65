"""The context-parallel test cases, shared by the worker processes (cp_worker.py) and the checking
test (test_cp.py): shapes, masks, seeded full-sequence inputs, and the global keep mask / score
bias a plain PyTorch reference needs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attngen.distributed import layout
from attngen.problem import keep_mask, random_inputs


@dataclass(frozen=True)
class Case:
    name: str
    worlds: tuple
    batch: int = 1
    hq: int = 4
    hkv: int = 2
    chunk: int = 13  # tokens per chunk of the layout (odd on purpose)
    d: int = 16
    dtype: torch.dtype = torch.bfloat16
    causal: bool = False
    window: tuple = (-1, -1)
    softcap: float = 0.0
    load_balance: object = "zigzag"
    layout: str = "bhsd"
    docs: object = None  # seqlen -> global document boundaries
    mask_mod: object = None  # callable (b, h, q_idx, kv_idx) on index tensors, also what attngen traces
    score_mod: object = None  # expression text
    bias: object = None  # (q_idx, kv_idx) index tensors -> the score bias score_mod adds
    rotate: object = None  # how torch moves the K/V shards (None: its default, one all-gather)

    def seqlen(self, world: int) -> int:
        return self.chunk * world * layout.chunks_per_rank(self.load_balance)

    def inputs(self, world: int, seed: int = 0):
        """Full-sequence (q, k, v, dout), (B, H, S, D)."""
        s = self.seqlen(world)
        b, d = self.batch, self.d
        return random_inputs((b, self.hq, s, d), (b, self.hkv, s, d), (b, self.hkv, s, d), (b, self.hq, s, d),
                             dtype=self.dtype, seed=seed)

    def kwargs(self, world: int) -> dict:
        kw = dict(causal=self.causal, window_size=self.window, softcap=self.softcap, rotate=self.rotate)
        if self.mask_mod is not None:
            kw["mask_mod"] = self.mask_mod
        if self.score_mod is not None:
            kw["score_mod"] = self.score_mod
        return kw

    def documents(self, world: int):
        return None if self.docs is None else tuple(self.docs(self.seqlen(world)))

    def keep(self, world: int) -> torch.Tensor:
        s = self.seqlen(world)
        keep = keep_mask(s, s, self.causal, self.window, top_left=True)
        qi, ki = torch.arange(s)[:, None], torch.arange(s)[None, :]
        if self.mask_mod is not None:
            keep = keep & self.mask_mod(0, 0, qi, ki)
        docs = self.documents(world)
        if docs is not None:
            ids = torch.bucketize(torch.arange(s), torch.tensor(docs[1:-1]), right=True)
            keep = keep & (ids[:, None] == ids[None, :])
        return keep

    def score_bias(self, world: int):
        if self.bias is None:
            return None
        s = self.seqlen(world)
        return self.bias(torch.arange(s)[:, None], torch.arange(s)[None, :]).float()


def _sink_window(b, h, q_idx, kv_idx):
    return (kv_idx < 3) | (q_idx - kv_idx < 17)


def _far_past(b, h, q_idx, kv_idx):  # rows 0..20 see nothing; many rows see nothing in their own shard
    return kv_idx < q_idx - 20


CASES = [
    Case("causal_zigzag_gqa", (2, 4), causal=True),
    Case("full_contiguous_softcap", (2,), batch=2, hq=2, hkv=2, chunk=29, d=32, dtype=torch.float16,
         load_balance=None, softcap=3.0),
    Case("causal_window_crossing", (2, 4), causal=True, window=(11, 0), rotate="alltoall"),
    Case("window_two_sided_bshd", (2,), hq=2, hkv=1, window=(5, 7), load_balance=None, layout="bshd"),
    Case("documents_causal", (2, 4), causal=True, dtype=torch.float16, docs=lambda s: (0, 5, s // 2 + 3, s - 7, s)),
    Case("documents_window", (2,), batch=2, hq=2, hkv=2, window=(6, 4), docs=lambda s: (0, 20, s)),
    Case("expressions_global", (2,), causal=True, mask_mod=_sink_window,
         score_mod="score - 0.05 * abs(q_idx - kv_idx)", bias=lambda q, k: -0.05 * (q - k).abs()),
    Case("expressions_empty_rows", (2,), hq=2, hkv=2, dtype=torch.float16, mask_mod=_far_past),
]


def cases_for(world: int) -> list:
    return [c for c in CASES if world in c.worlds]
