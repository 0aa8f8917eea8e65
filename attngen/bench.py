"""`attngen bench`: forward and forward+backward TFLOP/s of attngen against cuDNN, FA2 and
FlexAttention, all measured in one process, written as JSON and printed as a table.

Conventions (the same as benchmarks/README.md and the peer anchors measured on our H200):

* time: median of ``triton.testing.do_bench(step, warmup, rep, return_mode="median")``;
* forward FLOPs = 2 * (D_qk + D_v) * B * Hq * pairs, where pairs is Sq * Sk for a full mask, half
  of it for a causal mask (the usual convention), and the exact count of attended (query, key) pairs
  for sliding-window and document masks; fwd+bwd = 3.5 x forward;
* fwd+bwd step = forward, then the gradients of sum(out * dout) for a fixed random dout.

A provider that cannot run a case records why (a string) where a number would be; the run goes on.
Every provider's output (and gradients) is compared once with attngen's before timing.

Imports nothing optional: no optuna, no sqlalchemy, no jinja2 (unless a kernel must be rendered).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Sequence

import torch

MODES = ("fwd", "fwdbwd")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
FWDBWD_FLOP_FACTOR = 3.5
TIMING = {"full": {"warmup_ms": 25, "rep_ms": 100}, "quick": {"warmup_ms": 5, "rep_ms": 20}}
# Max |out - attngen's out| above which a row's check is marked failed (informational, not fatal).
OUT_TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 5e-3}


# --------------------------------------------------------------------------------------------------
# Cases and FLOP counting
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One benchmark shape: square sequences (Sq = Sk = seqlen), Dqk = Dv = head_dim. The names
    match the rows of the H200 anchors."""

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


# --------------------------------------------------------------------------------------------------
# Providers: one table
# --------------------------------------------------------------------------------------------------


class Unsupported(Exception):
    """A provider cannot run a case; the message is recorded in place of a number."""


@dataclass
class Inputs:
    """One case's tensors, shared by every provider: dense (B, H, S, D), contiguous."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    cu_seqlens: torch.Tensor  # int32 document offsets within the packed (B * S) tokens


@dataclass
class Prepared:
    """A provider bound to one case: `forward()` runs it on `leaves` and returns out."""

    forward: Callable[[], torch.Tensor]
    leaves: tuple[torch.Tensor, ...]  # (q, k, v) in the provider's layout
    dout: torch.Tensor  # in the provider's layout
    # (out, [dq, dk, dv]) in the provider's layout -> dense (B, H, S, D) for the checks
    to_dense: Callable[[tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]] = lambda ts: ts
    context: Callable[[], ContextManager] = contextlib.nullcontext
    note: str | None = None


@dataclass(frozen=True)
class Provider:
    name: str  # JSON key
    label: str  # what it is, for the JSON header and README
    prepare: Callable[[Case, Inputs, str], Prepared]  # raises Unsupported(reason)


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def _need_grad(out: torch.Tensor, what: str) -> None:
    if not out.requires_grad:
        raise Unsupported(f"not available: {what} is not differentiable yet (no autograd)")


def _pack(t: torch.Tensor) -> torch.Tensor:
    """(B, H, S, D) -> packed (B * S, H, D)."""
    B, H, S, D = t.shape
    return t.detach().transpose(1, 2).reshape(B * S, H, D).contiguous()


def _unpack(t: torch.Tensor, batch: int) -> torch.Tensor:
    T, H, D = t.shape
    return t.reshape(batch, T // batch, H, D).transpose(1, 2)


def _prepare_attngen(case: Case, x: Inputs, mode: str) -> Prepared:
    import attngen

    grad = mode == "fwdbwd"
    if case.docs:
        varlen = getattr(attngen, "attention_varlen", None)
        if varlen is None:
            raise Unsupported("not available: attngen.attention_varlen is missing")
        q, k, v = (_pack(t).requires_grad_(grad) for t in (x.q, x.k, x.v))
        cu, max_len = x.cu_seqlens, max(case.doc_lens)
        kw = {"causal": case.causal}
        if case.window > 0:
            kw["window_size"] = case.window_size

        def forward():
            return _first(varlen(q, k, v, cu, cu, max_len, max_len, **kw))

        prepared = Prepared(forward, (q, k, v), _pack(x.dout),
                            to_dense=lambda ts: tuple(_unpack(t, case.batch) for t in ts))
    else:

        def forward():
            return attngen.attention(x.q, x.k, x.v, causal=case.causal,
                                     window_size=case.window_size)

        prepared = Prepared(forward, (x.q, x.k, x.v), x.dout)
    if grad:
        _need_grad(prepared.forward(),
                   "attngen.attention_varlen" if case.docs else "attngen.attention")
    return prepared


def _sdpa_refusal(call: Callable[[], object], context: Callable[[], ContextManager],
                  device: torch.device) -> str | None:
    """Run `call` once under `context`; None if it ran, else why the backend refused it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with context():
                call()
            _sync(device)
            return None
        except RuntimeError as exc:
            why = [str(w.message).strip() for w in caught if "because" in str(w.message)]
            return "refused: " + ("; ".join(why) or str(exc).strip().splitlines()[0])[:400]


def _sdpa_provider(backend: str) -> Callable[[Case, Inputs, str], Prepared]:
    def prepare(case: Case, x: Inputs, mode: str) -> Prepared:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if case.docs:
            raise Unsupported("skipped: SDPA has no document (varlen) mask")
        if case.window > 0:
            raise Unsupported("skipped: sliding window is not expressible in SDPA (no window "
                              "argument; a dense attn_mask leaves the fused kernels)")
        chosen = getattr(SDPBackend, backend)

        def context():
            return sdpa_kernel([chosen])

        def bind(k, v, gqa) -> Prepared:
            def forward():
                return F.scaled_dot_product_attention(x.q, k, v, is_causal=case.causal,
                                                      enable_gqa=gqa)

            return Prepared(forward, (x.q, k, v), x.dout, context=context)

        def refusal(p: Prepared) -> str | None:
            if mode == "fwd":
                with torch.no_grad():
                    return _sdpa_refusal(p.forward, context, x.q.device)
            return _sdpa_refusal(lambda: torch.autograd.grad(p.forward(), p.leaves, p.dout),
                                 context, x.q.device)

        gqa = case.heads_q != case.heads_kv
        prepared = bind(x.k, x.v, gqa)
        why = refusal(prepared)
        if why is None:
            return prepared
        if not gqa:
            raise Unsupported(why)
        # The backend refused enable_gqa: give it K/V expanded to Hq heads (outside the timed step;
        # dK/dV are summed back over each group for the check).
        g = case.heads_q // case.heads_kv
        k, v = (t.detach().repeat_interleave(g, dim=1).requires_grad_(mode == "fwdbwd")
                for t in (x.k, x.v))
        expanded = bind(k, v, False)
        if refusal(expanded) is not None:
            raise Unsupported(why)

        def to_dense(ts):
            if len(ts) == 1:
                return ts
            out, dq, dk, dv = ts
            fold = [t.unflatten(1, (case.heads_kv, g)).sum(2) for t in (dk, dv)]
            return (out, dq, *fold)

        expanded.to_dense = to_dense
        expanded.note = f"enable_gqa {why}; ran with K/V expanded to {case.heads_q} heads"
        return expanded

    return prepare


def _configure_dynamo() -> None:
    """Never let a compiled FlexAttention silently fall back to eager (the failure in the first
    anchors file): a high recompile limit, and an error instead of a fallback when it is hit."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(int(getattr(cfg, name)), 64))
    for name in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
        if hasattr(cfg, name):
            setattr(cfg, name, True)


def _flex_mask_mod(case: Case, x: Inputs):
    """The case's mask as a FlexAttention mask_mod (None for a full mask). A window of w keys is
    causal (window_size = (w - 1, 0)); document ids keep each query inside its own document."""
    if not (case.causal or case.window > 0 or case.docs):
        return None
    doc = None
    if case.docs:
        lens = torch.tensor(case.doc_lens, device=x.q.device)
        doc = torch.repeat_interleave(torch.arange(case.docs, device=x.q.device), lens)
    causal, w = case.causal or case.window > 0, case.window

    def mask_mod(b, h, q_idx, kv_idx):
        keep = q_idx >= kv_idx if causal else None
        if w > 0:
            keep = keep & (q_idx - kv_idx < w)
        if doc is not None:
            same = doc[q_idx] == doc[kv_idx]
            keep = same if keep is None else keep & same
        return keep

    return mask_mod


def _prepare_flex(case: Case, x: Inputs, mode: str) -> Prepared:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.reset()  # a fresh compile per case and mode: no recompile limit to hit
    _configure_dynamo()
    mask_mod = _flex_mask_mod(case, x)
    block_mask = None
    if mask_mod is not None:
        block_mask = create_block_mask(mask_mod, None, None, case.seqlen, case.seqlen,
                                       device=x.q.device)
    compiled = torch.compile(flex_attention, dynamic=False)
    gqa = case.heads_q != case.heads_kv

    def forward():
        return compiled(x.q, x.k, x.v, block_mask=block_mask, enable_gqa=gqa)

    return Prepared(forward, (x.q, x.k, x.v), x.dout)


PROVIDERS: tuple[Provider, ...] = (
    Provider("attngen", "attngen generated Triton kernels", _prepare_attngen),
    Provider("cudnn", "SDPA, CUDNN_ATTENTION backend", _sdpa_provider("CUDNN_ATTENTION")),
    Provider("fa2", "SDPA, FLASH_ATTENTION backend (FlashAttention-2)",
             _sdpa_provider("FLASH_ATTENTION")),
    Provider("flex", "torch.compile(flex_attention) with block masks", _prepare_flex),
)
PROVIDERS_BY_NAME = {p.name: p for p in PROVIDERS}
REFERENCE = "attngen"  # ratios are attngen / peer; checks compare against attngen's output


# --------------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------------


def make_inputs(case: Case, dtype: torch.dtype, device: torch.device, mode: str,
                seed: int = 0) -> Inputs:
    g = torch.Generator(device=device).manual_seed(seed)
    B, S, D = case.batch, case.seqlen, case.head_dim
    grad = mode == "fwdbwd"

    def rand(h):
        return torch.randn((B, h, S, D), generator=g, device=device, dtype=dtype)

    q, k, v = (rand(h).requires_grad_(grad) for h in (case.heads_q, case.heads_kv, case.heads_kv))
    offs = [0]
    for _ in range(B):
        for n in case.doc_lens:
            offs.append(offs[-1] + n)
    cu = torch.tensor(offs, dtype=torch.int32, device=device)
    return Inputs(q, k, v, rand(case.heads_q), cu)


def make_step(p: Prepared, mode: str) -> Callable[[], tuple[torch.Tensor, ...]]:
    if mode == "fwd":
        return lambda: (p.forward(),)

    def step():
        out = p.forward()
        return (out, *torch.autograd.grad(out, p.leaves, p.dout))

    return step


def do_bench_timer(step: Callable[[], object], warmup_ms: int, rep_ms: int) -> float:
    from triton.testing import do_bench

    return float(do_bench(step, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    from attngen.testing import max_err

    if a.shape != b.shape:  # no broadcasting past a layout mistake
        raise ValueError(f"shape {tuple(a.shape)} vs reference {tuple(b.shape)}")
    return max_err(a, b)


def _describe_error(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"error: {type(exc).__name__}: {first}"[:400]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Row:
    case: Case
    mode: str
    dtype: torch.dtype
    flops: float
    tflops: dict[str, float | str] = field(default_factory=dict)
    ms: dict[str, float] = field(default_factory=dict)
    first_call_s: dict[str, float] = field(default_factory=dict)
    max_abs_diff: dict[str, dict[str, float]] = field(default_factory=dict)
    check_ok: dict[str, bool] = field(default_factory=dict)
    check_ref: str | None = None
    notes: dict[str, str] = field(default_factory=dict)

    def ratios(self) -> dict[str, float | None]:
        ours = self.tflops.get(REFERENCE)
        out = {}
        for name, theirs in self.tflops.items():
            if name == REFERENCE:
                continue
            ok = isinstance(ours, float) and isinstance(theirs, float) and theirs > 0
            out[f"{REFERENCE}/{name}"] = round(ours / theirs, 3) if ok else None
        return out

    def as_json(self) -> dict:
        d = {"case": self.case.name, "mode": self.mode, **self.case.describe(),
             "dtype": DTYPE_NAMES[self.dtype], "flops": self.flops,
             "tflops": self.tflops, "ratios": self.ratios(), "ms": self.ms,
             "first_call_s": self.first_call_s, "max_abs_diff": self.max_abs_diff,
             "check_ok": self.check_ok, "check_ref": self.check_ref, "notes": self.notes}
        if "flex" in self.first_call_s:
            d["flex_compile_s"] = self.first_call_s["flex"]
        return d


def run_case(case: Case, mode: str, providers: Sequence[Provider], dtype: torch.dtype,
             device: torch.device, timer: Callable[[Callable[[], object]], float],
             log: Callable[[str], None] = lambda s: None) -> Row:
    """Measure every provider on one case and mode. Never raises for a provider's failure."""
    row = Row(case, mode, dtype, case_flops(case, mode))
    x = make_inputs(case, dtype, device, mode)
    ref: tuple[torch.Tensor, ...] | None = None
    names = ("out", "dq", "dk", "dv")
    for prov in providers:
        grad_ctx = torch.no_grad() if mode == "fwd" else contextlib.nullcontext()
        try:
            with grad_ctx:
                p = prov.prepare(case, x, mode)
                step = make_step(p, mode)
                with p.context():
                    t0 = time.perf_counter()
                    results = step()
                    _sync(device)
                    row.first_call_s[prov.name] = round(time.perf_counter() - t0, 3)
                    dense = tuple(t.detach() for t in p.to_dense(results))
                    del results
                    if not all(bool(torch.isfinite(t).all()) for t in dense):
                        row.notes[prov.name] = "non-finite values in the output or gradients"
                    if ref is None:
                        ref, row.check_ref = dense, prov.name
                    else:
                        diffs = {n: _max_abs_diff(a, b) for n, a, b in zip(names, dense, ref)}
                        row.max_abs_diff[prov.name] = {n: round(d, 6) for n, d in diffs.items()}
                        row.check_ok[prov.name] = diffs["out"] <= OUT_TOLERANCE[dtype]
                    del dense
                    ms = timer(step)
            row.ms[prov.name] = round(ms, 4)
            row.tflops[prov.name] = round(row.flops / (ms * 1e-3) / 1e12, 1)
            if p.note:
                row.notes[prov.name] = p.note
        except Unsupported as exc:
            row.tflops[prov.name] = str(exc)
        except Exception as exc:  # noqa: BLE001 - a provider's failure (OOM too) is a result
            row.tflops[prov.name] = _describe_error(exc)
        finally:
            p = step = None
            if prov.name == "flex":
                torch._dynamo.reset()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        log(f"  {case.name:<18} {mode:<7} {prov.name:<8} {_fmt_value(row.tflops[prov.name], 72)}")
    return row


# --------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------


def _fmt_value(v, width: int = 8) -> str:
    if isinstance(v, float):
        return f"{v:.1f}"
    return (v or "-")[:width]


# the table's word for a reason string, by its prefix
_SHORT = {"skipped": "skip", "refused": "refused", "not available": "n/a", "error": "error",
          "-": "-"}


def _ratio_cell(x: float | None) -> str:
    return f"{'-' if x is None else format(x, '.2f'):>9}"


def format_table(rows: Sequence[Row], providers: Sequence[Provider]) -> str:
    names = [p.name for p in providers]
    peers = [n for n in names if n != REFERENCE]
    head = (f"{'case':<18} {'mode':<7}" + "".join(f"{n:>9}" for n in names)
            + "".join(f"{REFERENCE[0] + '/' + n:>9}" for n in peers if REFERENCE in names))
    lines = ["TFLOP/s (ratio = attngen / peer)", head, "-" * len(head)]
    reasons = []
    for r in rows:
        cells = []
        for n in names:
            v = r.tflops.get(n, "-")
            if isinstance(v, str):
                if v != "-":
                    reasons.append(f"{r.case.name} {r.mode} {n}: {v}")
                v = _SHORT.get(v.split(":")[0], "error")
            flag = "!" if r.check_ok.get(n) is False else ""
            cells.append(f"{_fmt_value(v) + flag:>9}")
        ratios = r.ratios()
        if REFERENCE in names:
            cells += [_ratio_cell(ratios.get(f"{REFERENCE}/{n}")) for n in peers]
        lines.append(f"{r.case.name:<18} {r.mode:<7}" + "".join(cells))
    if any(ok is False for r in rows for ok in r.check_ok.values()):
        lines.append("! = output differs from the reference by more than "
                     f"{OUT_TOLERANCE[rows[0].dtype]} (see max_abs_diff)")
    if reasons:
        lines += ["", "not measured:"] + [f"  {s}" for s in reasons]
    return "\n".join(lines)


def _git_commit() -> str | None:
    try:
        res = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=Path(__file__).resolve().parent)
        return res.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def header(device: torch.device, dtype: torch.dtype, quick: bool,
           providers: Sequence[Provider]) -> dict:
    import triton

    from attngen import __version__

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    cap = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    return {
        "gpu": gpu,
        "capability": f"{cap[0]}.{cap[1]}" if cap else None,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
        "attngen": __version__,
        "git_commit": _git_commit(),
        "python": sys.version.split()[0],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "dtype": DTYPE_NAMES[dtype],
        "timing": {**TIMING["quick" if quick else "full"], "return_mode": "median",
                   "function": "triton.testing.do_bench"},
        "flops": "forward 2*(Dqk+Dv)*B*Hq*pairs; pairs = Sq*Sk (full), Sq*Sk/2 (causal), exact "
                 "count (sliding window, documents); fwdbwd = 3.5 x forward",
        "providers": {p.name: p.label for p in providers},
    }


def write_json(path: Path, head: dict, rows: Sequence[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({**head, "rows": [r.as_json() for r in rows]}, indent=1) + "\n")
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=("fwd", "fwdbwd", "both"), default="fwd",
                   help="forward only, forward+backward, or both (default: fwd)")
    p.add_argument("--cases", default=None,
                   help=f"comma-separated case names (default: all): {', '.join(CASES_BY_NAME)}")
    p.add_argument("--providers", default=None,
                   help=f"comma-separated providers (default: all): {', '.join(PROVIDERS_BY_NAME)}")
    p.add_argument("--out", default=None, help="write the results as JSON to this file")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16", help="default: bf16")
    p.add_argument("--quick", action="store_true",
                   help="short warmup/rep (%(q)s ms) for smoke runs" % {
                       "q": "/".join(map(str, TIMING["quick"].values()))})


def _pick(arg: str | None, table: dict, what: str) -> list:
    if not arg:
        return list(table.values())
    names = [s.strip() for s in arg.split(",") if s.strip()]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(table)})")
    return [table[n] for n in names]


def main(args: argparse.Namespace) -> int:
    try:
        cases = _pick(args.cases, CASES_BY_NAME, "case")
        providers = _pick(args.providers, PROVIDERS_BY_NAME, "provider")
    except ValueError as exc:
        print(f"attngen bench: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("attngen bench: needs a CUDA GPU (torch.cuda.is_available() is False)",
              file=sys.stderr)
        return 1
    device = torch.device("cuda")
    dtype = DTYPES[args.dtype]
    modes = MODES if args.mode == "both" else (args.mode,)
    timing = TIMING["quick" if args.quick else "full"]
    head = header(device, dtype, args.quick, providers)
    out = Path(args.out) if args.out else None
    print(f"attngen bench on {head['gpu']}: torch {head['torch']}, triton {head['triton']}, "
          f"{args.dtype}, modes {', '.join(modes)}", flush=True)

    def timer(step):
        return do_bench_timer(step, timing["warmup_ms"], timing["rep_ms"])

    rows: list[Row] = []
    for mode in modes:
        for case in cases:
            rows.append(run_case(case, mode, providers, dtype, device, timer,
                                 log=lambda s: print(s, flush=True)))
            if out is not None:
                write_json(out, head, rows)  # after every row: a cut-short run keeps what it had
    print()
    print(format_table(rows, providers))
    if out is not None:
        print(f"\nwrote {out}")
    return 0
