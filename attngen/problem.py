"""One attention problem and its reference: shared by the CPU and GPU tests, the benchmarks and the
tuner's objective.

`Problem` says what is computed: batch, query and KV heads, sequence lengths, head dims, dtype, the
mask (causal, flash-attn window, alignment), softcap, scale, the layout (bhsd | bshd | packed) and,
for packed documents, each document's lengths. It makes seeded inputs, counts attended pairs and
FLOPs, and computes the reference (out, LSE) in its own layout.

`attention_ref` is the one reference implementation: plain PyTorch attention on (B, H, S, D) tensors
in float64 (or, for the flash-attn rule's error budget, in the inputs' own precision), GQA by
repeating KV heads, softcap, any keep mask; fully masked rows give 0 and LSE -inf. `keep_mask` is the
flash-attn mask convention, `attended_pairs` counts it exactly.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
LAYOUTS = ("bhsd", "bshd", "packed")


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


def attended_pairs(seqlen_q: int, seqlen_k: int, causal: bool = False,
                   window_size: tuple[int, int] = (-1, -1), top_left: bool = False) -> int:
    """Exact number of (query, key) pairs keep_mask keeps: query i sees keys j with
    i + off - left <= j <= i + off + right, off = Sk - Sq (bottom-right) or 0 (top-left), a side of
    -1 unbounded, causal forcing right = 0."""
    left, right = window_size
    if causal:
        right = 0
    i = np.arange(seqlen_q, dtype=np.int64) + (0 if top_left else seqlen_k - seqlen_q)
    hi = np.minimum(i + right, seqlen_k - 1) if right >= 0 else np.full_like(i, seqlen_k - 1)
    lo = np.maximum(i - left, 0) if left >= 0 else np.zeros_like(i)
    return int(np.clip(hi - lo + 1, 0, None).sum())


def attention_ref(q, k, v, *, causal=False, window_size=(-1, -1), softcap=0.0, scale=None,
                  top_left=False, upcast=True, keep=None, bias=None):
    """Plain PyTorch attention on (B, H, S, D) tensors; returns (out, lse).

    upcast=True computes in float64 (the reference); upcast=False computes in the inputs' precision
    the way a straightforward PyTorch implementation would (scores and P@V in the input dtype,
    softmax in fp32), which sets the error budget of the flash-attn rule. Fully masked rows give 0
    and lse -inf. bias (broadcast to (B, H, Sq, Sk)): added to the scores after softcapping (an
    additive bias such as flash-attn's ALiBi), in the scores' precision.
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
    if bias is not None:
        s = s + bias.to(s.dtype)
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


@dataclass(frozen=True)
class Problem:
    """One attention call. Dense layouts: `batch` sequences of seqlen_q queries and seqlen_k keys.
    Packed ("packed", flash-attn varlen: (tokens, heads, dim)): `batch` documents, by default of
    seqlen_q / seqlen_k tokens each; `documents` gives each document's (query, key) lengths instead
    (then batch is their count and seqlen_q / seqlen_k their longest)."""

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim_qk: int
    head_dim_v: int
    dtype: str = "bf16"
    causal: bool = False
    window: tuple[int, int] = (-1, -1)  # flash-attn (left, right), -1 = unbounded
    softcap: float = 0.0
    scale: float | None = None  # None: 1 / sqrt(head_dim_qk)
    top_left: bool = False  # causal / window alignment; False = bottom-right (flash-attn)
    layout: str = "bhsd"
    documents: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.heads_kv < 1 or self.heads_q % self.heads_kv:
            raise ValueError(f"heads_q ({self.heads_q}) must be a multiple of heads_kv ({self.heads_kv})")
        if self.documents and self.layout != "packed":
            raise ValueError("documents need layout 'packed'")

    @classmethod
    def packed_documents(cls, lens_q, lens_k, **kw) -> Problem:
        """Packed documents of the given (query, key) lengths."""
        docs = tuple(zip((int(n) for n in lens_q), (int(n) for n in lens_k)))
        return cls(batch=len(docs), seqlen_q=max(a for a, _ in docs), seqlen_k=max(b for _, b in docs),
                   layout="packed", documents=docs, **kw)

    # ---- what it is ---------------------------------------------------------------------------
    @property
    def gqa_ratio(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_dim_qk)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def packed(self) -> bool:
        return self.layout == "packed"

    def doc_lens(self) -> tuple[tuple[int, int], ...]:
        """(query, key) lengths of each sequence or document."""
        return self.documents or ((self.seqlen_q, self.seqlen_k),) * self.batch

    def shapes(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """Shapes of q, k, v in the problem's layout."""
        hq, hkv, dqk, dv = self.heads_q, self.heads_kv, self.head_dim_qk, self.head_dim_v
        if self.packed:
            tq, tk = (sum(x) for x in zip(*self.doc_lens()))
            return (tq, hq, dqk), (tk, hkv, dqk), (tk, hkv, dv)
        b, sq, sk = self.batch, self.seqlen_q, self.seqlen_k
        if self.layout == "bshd":
            return (b, sq, hq, dqk), (b, sk, hkv, dqk), (b, sk, hkv, dv)
        return (b, hq, sq, dqk), (b, hkv, sk, dqk), (b, hkv, sk, dv)

    # ---- inputs -------------------------------------------------------------------------------
    def make_inputs(self, device="cpu", seed: int = 0, mults=None,
                    requires_grad: bool = False) -> list[torch.Tensor]:
        """q, k, v (random_inputs: seeded, N(0, 1) in fp32 rounded to the dtype)."""
        return random_inputs(*self.shapes(), dtype=self.torch_dtype, device=device, seed=seed,
                             mults=mults, requires_grad=requires_grad)

    def cu_seqlens(self, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """int32 cumulative query and key offsets of the packed documents."""
        lq, lk = zip(*self.doc_lens())
        return tuple(torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=device)
                     for lens in (lq, lk))

    # ---- counting -----------------------------------------------------------------------------
    def pairs(self, exact: bool = True) -> int | float:
        """Attended (query, key) pairs of one head, summed over sequences / documents. exact=False
        is the usual benchmark convention: a plain causal mask on one dense sequence counts half of
        Sq * Sk."""
        if not exact and not self.packed and self.window == (-1, -1):
            full = self.seqlen_q * self.seqlen_k * self.batch
            return full / 2 if self.causal else full
        return sum(attended_pairs(a, b, self.causal, self.window, self.top_left) for a, b in self.doc_lens())

    def flops(self, exact: bool = True) -> float:
        """Forward FLOPs: 2 (Dqk + Dv) per attended pair and query head."""
        return float(2 * (self.head_dim_qk + self.head_dim_v) * self.heads_q * self.pairs(exact))

    # ---- reference ----------------------------------------------------------------------------
    def keep(self, device=None) -> torch.Tensor:
        """(Sq, Sk) keep mask of one dense sequence; packed: the block-diagonal (tokens_q,
        tokens_k) mask of every document's own mask."""
        if not self.packed:
            return keep_mask(self.seqlen_q, self.seqlen_k, self.causal, self.window, self.top_left,
                             device=device)
        lens = self.doc_lens()
        keep = torch.zeros(sum(a for a, _ in lens), sum(b for _, b in lens), dtype=torch.bool,
                           device=device)
        oq = ok = 0
        for a, b in lens:
            keep[oq:oq + a, ok:ok + b] = keep_mask(a, b, self.causal, self.window, self.top_left,
                                                   device=device)
            oq, ok = oq + a, ok + b
        return keep

    def reference(self, q, k, v, upcast: bool = True, max_scores: int | None = None):
        """(out, lse) of attention_ref for inputs in the problem's layout: out in that layout, lse
        (B, Hq, Sq), or (Hq, tokens) when packed. Differentiable (autograd gives the reference
        gradients). max_scores bounds the score elements (float64 temporaries) of one step: dense
        layouts then run over chunks of query rows."""
        kw = dict(softcap=self.softcap, scale=self.softmax_scale, upcast=upcast)
        if self.packed:
            t = lambda x: x.transpose(0, 1).unsqueeze(0)  # (T, H, D) -> (1, H, T, D)
            out, lse = attention_ref(t(q), t(k), t(v), keep=self.keep(q.device), **kw)
            return out[0].transpose(0, 1), lse[0]
        if self.layout == "bshd":
            out, lse = self._dense_reference(*(x.transpose(1, 2) for x in (q, k, v)), kw, max_scores)
            return out.transpose(1, 2), lse
        return self._dense_reference(q, k, v, kw, max_scores)

    def _dense_reference(self, q, k, v, kw: dict, max_scores: int | None):
        B, Hq, Sq, _ = q.shape
        keep = self.keep(q.device)
        rows = Sq if not max_scores else max(1, max_scores // max(1, B * Hq * k.shape[2]))
        if rows >= Sq:
            return attention_ref(q, k, v, keep=keep, **kw)
        outs, lses = [], []
        for r0 in range(0, Sq, rows):
            o, lse = attention_ref(q[:, :, r0:r0 + rows], k, v, keep=keep[r0:r0 + rows], **kw)
            outs.append(o)
            lses.append(lse)
        return torch.cat(outs, dim=2), torch.cat(lses, dim=2)

    def as_dict(self) -> dict:
        """The shape as the tuning database records it."""
        return {"batch": self.batch, "heads_q": self.heads_q, "heads_kv": self.heads_kv,
                "seqlen_q": self.seqlen_q, "seqlen_k": self.seqlen_k, "varlen": self.packed,
                "causal": self.causal, "window": list(self.window), "softcap": self.softcap,
                "scale": self.softmax_scale, "top_left": self.top_left, "dtype": self.dtype}


def grouped_reference(problem: Problem, gqa: int, t: dict, chunk, max_scores: int, device) -> dict:
    """The tuner's references of one input set `t` (dense (B, H, S, D) or packed (T, H, D) q, k, v
    and optionally dout), bounded in memory: per batch row or packed document, per KV head g,
    chunk(view, query heads of g, g, keep, rows, kwargs) -> {name: (1, heads, S, D) tensor} over
    query-row chunks of at most max_scores score elements. Results in the input's layout (packed:
    (T, H, D) outputs, (H, T) LSEs)."""
    p = problem
    keep = keep_mask(p.seqlen_q, p.seqlen_k, p.causal, p.window, p.top_left, device=device)
    rows = max(16, max_scores // max(1, gqa * p.seqlen_k))
    kw = dict(softcap=p.softcap, scale=p.softmax_scale)
    ref: dict[str, list] = {}
    for v in unit_views(p, t):
        parts: dict[str, list] = {}
        for g in range(p.heads_kv):
            for n, x in chunk(v, slice(g * gqa, (g + 1) * gqa), g, keep, rows, kw).items():
                parts.setdefault(n, []).append(x)
        for n, xs in parts.items():
            ref.setdefault(n, []).append(torch.cat(xs, dim=1))
    out = {n: torch.cat(xs, dim=0) for n, xs in ref.items()}  # (B or documents, H, S, D)
    if p.packed:
        for n, x in out.items():
            out[n] = (x.permute(1, 0, 2).reshape(x.shape[1], -1) if n.startswith("lse")
                      else x.permute(0, 2, 1, 3).reshape(-1, x.shape[1], x.shape[3]))
    return out


def unit_views(p: Problem, t: dict) -> list[dict]:
    """(1, H, S, D) views of an input set: one per batch row, or one per packed document of
    seqlen_q / seqlen_k tokens; "unit": its index (the b of an expression)."""
    names = [n for n in ("q", "k", "v", "dout") if n in t]
    if not p.packed:
        return [{"unit": b, **{n: t[n][b:b + 1] for n in names}} for b in range(p.batch)]
    views = []
    for d in range(p.batch):
        rq, rk = slice(d * p.seqlen_q, (d + 1) * p.seqlen_q), slice(d * p.seqlen_k, (d + 1) * p.seqlen_k)
        views.append({"unit": d, **{n: t[n][rk if n in ("k", "v") else rq].transpose(0, 1).unsqueeze(0)
                                    for n in names}})
    return views


def output_chunk(p: Problem, v: dict, hs: slice, g: int, keep, rows: int, kw: dict, attn=None) -> dict:
    """grouped_reference's forward chunk: out64 / lse64 (float64) and out_pt (same precision) of
    KV head g's query heads `hs` of one (1, H, S, D) view, over query-row chunks. attn(q, k, v, r0,
    upcast) -> (out, lse): the attention of rows r0.. (default: attention_ref with `keep`, `kw`)."""
    attn = attn or _plain(keep, kw)
    outs = {"out64": [], "lse64": [], "out_pt": []}
    for r0 in range(0, p.seqlen_q, rows):
        q, k, vv = v["q"][:, hs, r0:r0 + rows], v["k"][:, g:g + 1], v["v"][:, g:g + 1]
        o64, l64 = attn(q, k, vv, r0, True)
        opt, _ = attn(q, k, vv, r0, False)
        outs["out64"].append(o64)
        outs["lse64"].append(l64)
        outs["out_pt"].append(opt)
    return {n: torch.cat(xs, dim=2) for n, xs in outs.items()}


def _plain(keep, kw):
    return lambda q, k, v, r0, upcast: attention_ref(q, k, v, keep=keep[r0:r0 + q.shape[2]], upcast=upcast, **kw)


def gradient_chunk(p: Problem, v: dict, hs: slice, g: int, keep, rows: int, kw: dict, attn=None) -> dict:
    """grouped_reference's backward chunk: dq / dk / dv in float64 ("64") and in the inputs'
    precision ("_pt") for dO = v["dout"], over query-row chunks (dK, dV summed over them); attn
    as output_chunk's."""
    attn = attn or _plain(keep, kw)
    res = {}
    for tag, upcast in (("64", True), ("_pt", False)):
        conv = (lambda x: x.double()) if upcast else (lambda x: x)
        k = conv(v["k"][:, g:g + 1]).detach().clone().requires_grad_(True)
        vv = conv(v["v"][:, g:g + 1]).detach().clone().requires_grad_(True)
        dk = torch.zeros(k.shape, dtype=torch.float64, device=k.device)
        dv = torch.zeros(vv.shape, dtype=torch.float64, device=k.device)
        dqs = []
        for r0 in range(0, p.seqlen_q, rows):
            q = conv(v["q"][:, hs, r0:r0 + rows]).detach().clone().requires_grad_(True)
            o, _ = attn(q, k, vv, r0, upcast)
            gq, gk, gv = torch.autograd.grad(o, (q, k, vv), conv(v["dout"][:, hs, r0:r0 + rows]))
            dqs.append(gq.double())
            dk += gk.double()
            dv += gv.double()
        res[f"dq{tag}"], res[f"dk{tag}"], res[f"dv{tag}"] = torch.cat(dqs, dim=2), dk, dv
    return res
