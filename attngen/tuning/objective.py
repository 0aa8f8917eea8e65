"""One kernel, one launch config, one shape: launch it, check its output against a reference, time
it. The tuner's objective.

This is the ONLY module of the tuner that calls the launchers of attngen.kernels (fwd.attn_fwd,
fwd.attn_fwd_varlen, bwd.attn_bwd, bwd.attn_bwd_varlen), all in `_launch` and `_forward_for_bwd`:
when their signatures change, this file changes with them and nothing else in attngen.tuning does.

A config's fate, recorded by the tuner as the trial's status:
  invalid  the validity filter (space.check_fwd / check_bwd) rejects it: never compiled
  failed   compiling or launching raised (out of shared memory or registers, a compile error), or
           its output broke the accuracy rule: the error text is kept, it never wins
  ok       checked, then timed: median ms of the timer over a step that rotates input sets
The check comes first, on outputs poisoned with NaN beforehand (a config that writes nothing fails);
the accuracy rule is attngen.testing's flash-attn rule against a float64 reference (forward factor 2,
backward factor 3, as the GPU tests), and the LSE must match the float64 one.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Callable

import torch

from attngen import env
from attngen.families import family as family_of
from attngen.families.bwd import attn_bwd, attn_bwd_varlen
from attngen.kernels.common import MaskArgs, mask_kind
from attngen.families.fwd import attn_fwd, attn_fwd_varlen
from attngen.runtime import loader
from attngen.spec import KernelSpec, SpecEntry
from attngen.problem import Problem, attention_ref, keep_mask
from attngen.testing import assert_flash_rule, assert_lse_close
from attngen.tuning import timing
from attngen.buckets import ShapeBucket

FWD_FACTOR, BWD_FACTOR, ATOL = 2.0, 3.0, 1e-5
REF_CHUNK = 1 << 26  # score elements per float64 reference chunk (512 MB)

Timer = Callable[..., float]  # timer(step, config: dict, problem: attngen.problem.Problem) -> ms


class DeviceLost(RuntimeError):
    """The GPU failed in a way that poisons the process (illegal address, launch failure): no
    further trial can be trusted. The tuner stops; `attngen tune --resume` continues in a fresh
    process."""


def mask_args(problem: Problem) -> MaskArgs:
    """The launchers' mask arguments of a problem."""
    mask, wl, wr = mask_kind(problem.causal, problem.window)
    return MaskArgs(scale=problem.softmax_scale, softcap=problem.softcap, window_left=wl, window_right=wr,
                    align_top_left=problem.top_left)


def problem_for(entry: SpecEntry, spec: KernelSpec, bucket: ShapeBucket) -> Problem:
    """The shape measured for `bucket`: Sq, Sk as the bucket says; batch x heads = the bucket's
    B*H class, with the entry's query-head count where it divides it (else fewer heads, a multiple
    of the GQA ratio); the entry's window, softcap, scale and causal alignment. Dense: batch x
    heads_q; varlen: `batch` packed documents of seqlen_q / seqlen_k tokens each (the bucket's
    longest document)."""
    if bucket.decode:
        raise ValueError(f"{bucket.key}: the decode bucket (Sq = 1) belongs to the split-KV family")
    gqa = spec.gqa_ratio
    bh = bucket.batch_heads
    want = entry.num_q_heads or 16 * gqa
    heads = max(gqa, (min(want, bh) // gqa) * gqa)
    while heads > gqa and bh % heads:
        heads -= gqa
    batch = max(1, bh // heads)
    inner = entry.document_mask if entry.mask == "document" else entry.mask
    if inner == "sliding_window":
        causal, window = True, (entry.window - 1, 0)
    else:
        causal, window = inner == "causal", (-1, -1)
    p = Problem(batch=batch, heads_q=heads, heads_kv=heads // gqa, seqlen_q=bucket.seqlen_q,
                seqlen_k=bucket.seqlen_k, head_dim_qk=spec.head_dim_qk, head_dim_v=spec.head_dim_v,
                dtype=spec.dtype, causal=causal, window=window, softcap=entry.softcap,
                scale=entry.softmax_scale or 1.0 / math.sqrt(spec.head_dim_qk),
                top_left=entry.causal_alignment == "top_left",
                layout="packed" if spec.varlen else "bhsd")
    mask = mask_kind(causal, window)[0]
    if mask != spec.mask or (entry.softcap > 0) != spec.softcap:
        raise ValueError(f"{spec.uri}: entry {entry.name!r} gives mask {mask!r}, softcap "
                         f"{entry.softcap}; the kernel is {spec.mask!r}, softcap={spec.softcap}")
    return p


@dataclass(frozen=True)
class Outcome:
    status: str  # "ok" | "failed" | "invalid"
    time_ms: float | None = None
    tflops: float | None = None
    error: str | None = None


def _error_text(exc: BaseException, limit: int = 2000) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= limit else text[:limit - 3] + "..."


class Objective:
    """Inputs, reference and launches of one kernel for one Problem on one device; `run(cfg)` is
    one trial."""

    def __init__(self, spec: KernelSpec, problem: Problem, device: str | torch.device = "cuda",
                 timer: Timer | None = None, seed: int = 0, light: bool = False):
        """light: one input set and no reference (tuning/precompile.py launches, never checks)."""
        self.problem = problem
        self.spec = spec
        self.family = self.spec.family
        self.device = torch.device(device)
        self.timer = timer or timing.do_bench_median
        self.dtype = problem.torch_dtype
        self.kind = "cpu" if env.interpreting() else self.device.type
        if env.interpreting():
            from attngen.interp import patch_interpreter

            patch_interpreter()
        self.mod = loader.load(self.spec)
        self.mask = mask_args(problem)
        # 2 (Dqk + Dv) per attended pair and head (the forward); the backward counts 2.5 times
        # that (attngen bench's convention). Exact pair counts for every mask.
        self.flops = problem.flops() * family_of(self.family).flop_factor
        self.fwd_spec = self.spec.replace(family="fwd")
        self.fwd_mod = loader.load(self.fwd_spec) if self.family == "bwd" else None
        first = self._make_set(seed)
        n = 1 if light else timing.rotation_sets(sum(t.numel() * t.element_size() for t in first.values()),
                                                 timing.l2_bytes(self.device))
        self.sets = [first] + [self._make_set(seed + i) for i in range(1, n)]
        self.ref = None if light else self._reference(first)

    # ---- inputs -----------------------------------------------------------------------------
    def _make_set(self, seed: int) -> dict[str, torch.Tensor]:
        p, s = self.problem, self.spec
        g = torch.Generator(device=self.device).manual_seed(1000 + seed)
        dev, dt = self.device, self.dtype

        def randn(*shape):
            return torch.randn(shape, generator=g, device=dev, dtype=torch.float32).to(dt)

        if s.varlen:
            tq, tk = p.batch * p.seqlen_q, p.batch * p.seqlen_k
            t = {"q": randn(tq, p.heads_q, s.head_dim_qk), "k": randn(tk, p.heads_kv, s.head_dim_qk),
                 "v": randn(tk, p.heads_kv, s.head_dim_v),
                 "out": torch.empty(tq, p.heads_q, s.head_dim_v, device=dev, dtype=dt),
                 "lse": torch.empty(p.heads_q, tq, device=dev, dtype=torch.float32),
                 "cu_q": torch.arange(0, tq + 1, p.seqlen_q, device=dev, dtype=torch.int32),
                 "cu_k": torch.arange(0, tk + 1, p.seqlen_k, device=dev, dtype=torch.int32)}
        else:
            t = {"q": randn(p.batch, p.heads_q, p.seqlen_q, s.head_dim_qk),
                 "k": randn(p.batch, p.heads_kv, p.seqlen_k, s.head_dim_qk),
                 "v": randn(p.batch, p.heads_kv, p.seqlen_k, s.head_dim_v),
                 "out": torch.empty(p.batch, p.heads_q, p.seqlen_q, s.head_dim_v, device=dev, dtype=dt),
                 "lse": torch.empty(p.batch, p.heads_q, p.seqlen_q, device=dev, dtype=torch.float32)}
        if self.family == "bwd":
            t["dout"] = randn(*t["out"].shape)
            t["dq"], t["dk"], t["dv"] = (torch.empty_like(t[n]) for n in ("q", "k", "v"))
            self._forward_for_bwd(t)
        return t

    def _outputs(self, t: dict) -> tuple[str, ...]:
        return family_of(self.family).outputs

    # ---- the launchers (the only calls into attngen.kernels) ----------------------------------
    def _forward_for_bwd(self, t: dict) -> None:
        """out and lse of a backward input set, by the forward kernel with its default config."""
        cfg = family_of("fwd").default(self.fwd_spec, self.kind, self.problem.seqlen_q)
        if self.spec.varlen:
            attn_fwd_varlen(self.fwd_mod, self.fwd_spec, t["q"], t["k"], t["v"], t["out"], t["lse"],
                            t["cu_q"], t["cu_k"], self.problem.seqlen_q, self.mask, cfg)
        else:
            attn_fwd(self.fwd_mod, self.fwd_spec, t["q"], t["k"], t["v"], t["out"], t["lse"],
                     self.mask, cfg)

    def _launch(self, cfg, t: dict) -> None:
        p, s = self.problem, self.spec
        if self.family == "fwd":
            if s.varlen:
                attn_fwd_varlen(self.mod, s, t["q"], t["k"], t["v"], t["out"], t["lse"], t["cu_q"],
                                t["cu_k"], p.seqlen_q, self.mask, cfg)
            else:
                attn_fwd(self.mod, s, t["q"], t["k"], t["v"], t["out"], t["lse"], self.mask, cfg)
        elif s.varlen:
            attn_bwd_varlen(self.mod, s, t["q"], t["k"], t["v"], t["out"], t["dout"], t["lse"],
                            t["dq"], t["dk"], t["dv"], t["cu_q"], t["cu_k"], p.seqlen_q, p.seqlen_k,
                            self.mask, cfg, False)
        else:
            attn_bwd(self.mod, s, t["q"], t["k"], t["v"], t["out"], t["dout"], t["lse"], t["dq"],
                     t["dk"], t["dv"], self.mask, cfg, False)

    # ---- reference --------------------------------------------------------------------------
    def _dense_views(self, t: dict) -> list[tuple[slice, dict]]:
        """(B, H, S, D) views of the input set: one per batch row, or one per packed document."""
        p = self.problem
        if not self.spec.varlen:
            return [(b, {n: t[n][b:b + 1] for n in ("q", "k", "v", "dout") if n in t})
                    for b in range(p.batch)]
        views = []
        for d in range(p.batch):
            rq = slice(d * p.seqlen_q, (d + 1) * p.seqlen_q)
            rk = slice(d * p.seqlen_k, (d + 1) * p.seqlen_k)
            v = {"q": t["q"][rq], "k": t["k"][rk], "v": t["v"][rk]}
            if "dout" in t:
                v["dout"] = t["dout"][rq]
            views.append((d, {n: x.transpose(0, 1).unsqueeze(0) for n, x in v.items()}))
        return views

    def _reference(self, t: dict) -> dict[str, torch.Tensor]:
        """float64 reference and same-precision PyTorch results of input set `t`, computed over
        chunks of (batch or document) x KV head x query rows to bound memory."""
        p = self.problem
        gqa = self.spec.gqa_ratio
        keep = keep_mask(p.seqlen_q, p.seqlen_k, p.causal, p.window, p.top_left, device=self.device)
        rows = max(16, REF_CHUNK // max(1, gqa * p.seqlen_k))
        kw = dict(softcap=p.softcap, scale=p.scale)
        views = self._dense_views(t)
        ref: dict[str, list] = {}
        for idx, v in views:
            parts: dict[str, torch.Tensor] = {}
            for g in range(p.heads_kv):
                hs = slice(g * gqa, (g + 1) * gqa)
                if self.family == "fwd":
                    outs = {"out64": [], "lse64": [], "out_pt": []}
                    for r0 in range(0, p.seqlen_q, rows):
                        q = v["q"][:, hs, r0:r0 + rows]
                        k, vv = v["k"][:, g:g + 1], v["v"][:, g:g + 1]
                        o64, l64 = attention_ref(q, k, vv, keep=keep[r0:r0 + rows], **kw)
                        opt, _ = attention_ref(q, k, vv, keep=keep[r0:r0 + rows], upcast=False, **kw)
                        outs["out64"].append(o64)
                        outs["lse64"].append(l64)
                        outs["out_pt"].append(opt)
                    for n, xs in outs.items():
                        parts.setdefault(n, []).append(torch.cat(xs, dim=2))
                else:
                    for n, x in self._grads_chunk(v, hs, g, keep, rows, kw).items():
                        parts.setdefault(n, []).append(x)
            for n, xs in parts.items():
                ref.setdefault(n, []).append(torch.cat(xs, dim=1))
        out = {n: torch.cat(xs, dim=0) for n, xs in ref.items()}  # (B or docs, H, S, D)
        if self.spec.varlen:  # back to the packed layouts of the kernels
            for n, x in out.items():
                if n.startswith("lse"):
                    out[n] = x.permute(1, 0, 2).reshape(x.shape[1], -1)
                else:
                    out[n] = x.permute(0, 2, 1, 3).reshape(-1, x.shape[1], x.shape[3])
        return out

    def _grads_chunk(self, v: dict, hs: slice, g: int, keep, rows: int, kw: dict) -> dict:
        p = self.problem
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
                o, _ = attention_ref(q, k, vv, keep=keep[r0:r0 + rows], upcast=upcast, **kw)
                dout = conv(v["dout"][:, hs, r0:r0 + rows])
                gq, gk, gv = torch.autograd.grad(o, (q, k, vv), dout)
                dqs.append(gq.double())
                dk += gk.double()
                dv += gv.double()
            res[f"dq{tag}"], res[f"dk{tag}"], res[f"dv{tag}"] = torch.cat(dqs, dim=2), dk, dv
        return res

    def check(self, t: dict) -> str | None:
        """None when the kernel's outputs in `t` pass the accuracy rule, else why not."""
        name = f"{self.spec.uri} {self.problem.seqlen_q}x{self.problem.seqlen_k}"
        try:
            if self.family == "fwd":
                assert_flash_rule(f"{name} out", t["out"], self.ref["out64"], self.ref["out_pt"],
                                  FWD_FACTOR, ATOL)
                assert_lse_close(f"{name} lse", t["lse"], self.ref["lse64"])
            else:
                for n in ("dq", "dk", "dv"):
                    assert_flash_rule(f"{name} {n}", t[n], self.ref[f"{n}64"], self.ref[f"{n}_pt"],
                                      BWD_FACTOR, ATOL)
        except AssertionError as exc:
            return str(exc).strip().splitlines()[0][:1000]
        return None

    # ---- one trial --------------------------------------------------------------------------
    def run(self, cfg) -> Outcome:
        why = family_of(self.family).check(self.spec, cfg)
        if why:
            return Outcome("invalid", error=why)
        first = self.sets[0]
        try:
            for n in self._outputs(first):
                first[n].fill_(float("nan"))
            self._launch(cfg, first)
            self._sync()
            wrong = self.check(first)
            if wrong:
                return Outcome("failed", error=f"wrong result: {wrong}")
            counter = itertools.count()
            sets = self.sets

            def step() -> None:
                self._launch(cfg, sets[next(counter) % len(sets)])

            ms = float(self.timer(step, dataclasses.asdict(cfg), self.problem))
            self._sync()
        except DeviceLost:
            raise
        except Exception as exc:  # compile error, out of resources, launch failure
            self._raise_if_device_lost(exc, cfg)
            return Outcome("failed", error=_error_text(exc))
        if not (ms > 0 and math.isfinite(ms)):
            return Outcome("failed", error=f"timer returned {ms!r} ms")
        return Outcome("ok", time_ms=ms, tflops=self.flops / ms / 1e9)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _raise_if_device_lost(self, exc: BaseException, cfg) -> None:
        if self.device.type != "cuda":
            return
        try:
            torch.cuda.synchronize(self.device)
            torch.zeros(1, device=self.device).add_(1).item()
        except Exception as again:
            raise DeviceLost(f"the GPU failed during config {dataclasses.asdict(cfg)} "
                             f"({_error_text(exc, 300)}; then {_error_text(again, 200)}): the CUDA "
                             f"context is lost, continue with `attngen tune --resume`") from None
