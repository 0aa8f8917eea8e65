"""The forward family's tuning hooks: what the tuner's objective (attngen.tuning.objective) needs of
it -- a problem's inputs, its launch, the float64 reference and the accuracy check. The family
record (attngen.families.fwd.FAMILY) names this module; the runtime never loads it."""

from __future__ import annotations

from attngen.families import expr_tuning as _expr
from attngen.families import fwd as _fwd

REF_CHUNK = 1 << 26  # score elements per float64 reference chunk (512 MB)


class TuningHooks:
    """Inputs, launch, reference and accuracy check of one forward problem; the objective calls
    these and never the launchers itself. `obj` is the Objective (problem, spec, mod, mask, device,
    dtype, kind)."""

    factor = 2.0  # the flash-attn rule: error <= 2 x PyTorch's in the same precision
    outputs = ("out", "lse")
    unit = "TFLOP/s"
    expr_grads = False  # an expression kernel's reference: the gradients (the backward's hooks)

    def throughput(self, obj, ms: float) -> float:
        """2 (Dqk + Dv) per attended pair and head, exact pair counts; TFLOP/s."""
        return obj.problem.flops() * obj.family.flop_factor / ms / 1e9

    def inputs(self, obj, seed: int) -> dict:
        import torch

        p, s = obj.problem, obj.spec
        g = torch.Generator(device=obj.device).manual_seed(1000 + seed)
        dev, dt = obj.device, obj.dtype

        def randn(*shape):
            return torch.randn(shape, generator=g, device=dev, dtype=torch.float32).to(dt)

        x = _expr.inputs(obj, seed) if s.has_expr else {}
        if s.varlen:
            tq, tk = p.batch * p.seqlen_q, p.batch * p.seqlen_k
            return {**x, "q": randn(tq, p.heads_q, s.head_dim_qk), "k": randn(tk, p.heads_kv, s.head_dim_qk),
                    "v": randn(tk, p.heads_kv, s.head_dim_v),
                    "out": torch.empty(tq, p.heads_q, s.head_dim_v, device=dev, dtype=dt),
                    "lse": torch.empty(p.heads_q, tq, device=dev, dtype=torch.float32),
                    "cu_q": torch.arange(0, tq + 1, p.seqlen_q, device=dev, dtype=torch.int32),
                    "cu_k": torch.arange(0, tk + 1, p.seqlen_k, device=dev, dtype=torch.int32)}
        return {**x, "q": randn(p.batch, p.heads_q, p.seqlen_q, s.head_dim_qk),
                "k": randn(p.batch, p.heads_kv, p.seqlen_k, s.head_dim_qk),
                "v": randn(p.batch, p.heads_kv, p.seqlen_k, s.head_dim_v),
                "out": torch.empty(p.batch, p.heads_q, p.seqlen_q, s.head_dim_v, device=dev, dtype=dt),
                "lse": torch.empty(p.batch, p.heads_q, p.seqlen_q, device=dev, dtype=torch.float32)}

    def launch(self, obj, cfg, t: dict, mod=None, spec=None) -> None:
        """Config `cfg` on input set `t`: the launches made once per (config, input set) and
        replayed (families.base.replay), so that a short bucket's timing is the GPU's, not the
        launchers' Python. With another module (`mod`, `spec`: the backward's inputs, made once per
        input set, never timed) the launchers run directly."""
        if mod is None and spec is None:
            from attngen.families.base import replay

            return replay(self, obj, cfg, t)
        mod, spec = mod or obj.mod, spec or obj.spec
        cu = (t["cu_q"], t["cu_k"], obj.problem.seqlen_q) if spec.varlen else ()
        for la in _fwd.fwd_launches(mod, spec, t["q"], t["k"], t["v"], t["out"], t["lse"], obj.mask, cfg, *cu,
                                    extra=_expr.extra(t)):
            la.run()

    def steps(self, obj, cfg, t: dict) -> list:
        """Config `cfg`'s launches on input set `t` (families.base.replay compiles and replays them)."""
        s = obj.spec
        cu = (t["cu_q"], t["cu_k"], obj.problem.seqlen_q) if s.varlen else ()
        return _fwd.fwd_launches(obj.mod, s, t["q"], t["k"], t["v"], t["out"], t["lse"], obj.mask, cfg, *cu,
                                 extra=_expr.extra(t))

    def chunk(self, obj, v: dict, hs: slice, g: int, keep, rows: int, kw: dict) -> dict:
        from attngen.problem import output_chunk

        return output_chunk(obj.problem, v, hs, g, keep, rows, kw)

    def reference(self, obj, t: dict) -> dict:
        """float64 reference and same-precision PyTorch results of input set `t`, over chunks of
        (batch or document) x KV head x query rows to bound memory."""
        from attngen.problem import grouped_reference

        if obj.spec.has_expr:
            return _expr.reference(obj, t, REF_CHUNK, grads=self.expr_grads)
        return grouped_reference(obj.problem, obj.spec.gqa_ratio, t, lambda *a: self.chunk(obj, *a),
                                 REF_CHUNK, obj.device)

    def check(self, obj, name: str, t: dict, ref: dict) -> None:
        from attngen.testing import assert_flash_rule, assert_lse_close

        assert_flash_rule(f"{name} out", t["out"], ref["out64"], ref["out_pt"], self.factor, 1e-5)
        assert_lse_close(f"{name} lse", t["lse"], ref["lse64"])
