"""The backward family's tuning hooks: the forward's inputs plus what the backward needs, its
launch, the float64 gradients as reference and the accuracy check (attngen.tuning.objective calls
them). The family record (attngen.families.bwd.FAMILY) names this module; the runtime never loads
it."""

from __future__ import annotations

from attngen.families import bwd as _bwd
from attngen.families import expr_tuning as _expr
from attngen.families import fwd as _fwd
from attngen.families import fwd_tuning as _fwd_tuning


class TuningHooks(_fwd_tuning.TuningHooks):
    """The forward's inputs plus dO, O and LSE (by the forward kernel with its default config) and
    the gradients' buffers; the reference is the float64 gradients (flash-attn rule, factor 3)."""

    factor = 3.0
    outputs = ("dq", "dk", "dv")
    expr_grads = True

    def inputs(self, obj, seed: int) -> dict:
        import torch

        t = super().inputs(obj, seed)
        g = torch.Generator(device=obj.device).manual_seed(2000 + seed)
        t["dout"] = torch.randn(t["out"].shape, generator=g, device=obj.device).to(obj.dtype)
        t["dq"], t["dk"], t["dv"] = (torch.empty_like(t[n]) for n in ("q", "k", "v"))
        fwd_spec = obj.spec.replace(family="fwd")
        cfg = _fwd.FAMILY.default(fwd_spec, obj.kind, obj.problem.seqlen_q)
        _fwd_tuning.TuningHooks.launch(self, obj, cfg, t, obj.load(fwd_spec), fwd_spec)
        return t

    def launch(self, obj, cfg, t: dict, mod=None, spec=None) -> None:
        """Config `cfg` on input set `t`, replayed per (config, input set) as the forward's: the
        launches of _bwd.attn_bwd (deterministic=False), with dQ's fp32 accumulator zeroed before
        them and copied into dq after them when the config accumulates dQ by atomics."""
        from attngen.families.base import replay

        replay(self, obj, cfg, t)

    def steps(self, obj, cfg, t: dict) -> list:
        import torch

        p, s = obj.problem, obj.spec
        dq, dk, dv = t["dq"], t["dk"], t["dv"]
        if t["q"].numel() == 0 or t["k"].numel() == 0:
            return [lambda: (dq.zero_(), dk.zero_(), dv.zero_())]
        atomic = cfg.atomic_dq
        delta = torch.empty_like(t["lse"])
        dq_acc = torch.zeros(dq.shape, dtype=torch.float32, device=dq.device) if atomic else dq
        cu = (t["cu_q"], t["cu_k"], p.seqlen_q, p.seqlen_k) if s.varlen else ()
        extra = {**_expr.extra(t), **_expr.backward_buffers(obj, t)} if s.has_expr else None
        launches = _bwd.bwd_launches(obj.mod, s, t["q"], t["k"], t["v"], t["out"], t["dout"], t["lse"], delta,
                                     dq_acc, dk, dv, obj.mask, cfg, atomic, *cu, extra=extra)
        return [dq_acc.zero_, *launches, lambda: dq.copy_(dq_acc)] if atomic else launches

    def chunk(self, obj, v: dict, hs: slice, g: int, keep, rows: int, kw: dict) -> dict:
        from attngen.problem import gradient_chunk

        return gradient_chunk(obj.problem, v, hs, g, keep, rows, kw)

    def check(self, obj, name: str, t: dict, ref: dict) -> None:
        from attngen.testing import assert_flash_rule

        for n in ("dq", "dk", "dv"):
            assert_flash_rule(f"{name} {n}", t[n], ref[f"{n}64"], ref[f"{n}_pt"], self.factor, 1e-5)
