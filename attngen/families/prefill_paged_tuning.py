"""The prefill_paged family's tuning hooks: what the tuner's objective (attngen.tuning.objective)
needs of it. The family record (attngen.families.prefill_paged.FAMILY) names this module; the
runtime never loads it."""

from __future__ import annotations

import dataclasses

from attngen.families import prefill_paged as _pp

REF_CHUNK = 1 << 26  # score elements per float64 reference chunk (512 MB)


class TuningHooks:
    """The bucket's problem as chunked prefill: `batch` sequences of seqlen_q queries (packed)
    against seqlen_k keys each, the keys in pages of PAGE_SIZE in shuffled order; the reference
    per sequence and KV head in float64 (the forward's, on the same keys packed densely);
    throughput in TFLOP/s of the attended pairs."""

    PAGE_SIZE = 16  # vLLM's page size, the smallest the family takes
    factor = 2.0  # the flash-attn rule
    outputs = ("out", "lse")
    unit = "TFLOP/s"

    def throughput(self, obj, ms: float) -> float:
        return obj.problem.flops() * obj.family.flop_factor / ms / 1e9

    def _packed(self, obj):
        return dataclasses.replace(obj.problem, layout="packed")

    def inputs(self, obj, seed: int) -> dict:
        import torch

        p = self._packed(obj)
        dev, dt = obj.device, obj.dtype
        q, k, v = p.make_inputs(device=dev, seed=1000 + seed)
        cu_q, cu_k = p.cu_seqlens(device=dev)
        page, per_seq = self.PAGE_SIZE, -(-p.seqlen_k // self.PAGE_SIZE)
        perm = torch.randperm(p.batch * per_seq, generator=torch.Generator().manual_seed(2000 + seed)).to(dev)
        t = {"q": q, "k": k, "v": v, "cu_q": cu_q, "table": perm.reshape(p.batch, per_seq).to(torch.int32),
             "used": torch.full((p.batch,), p.seqlen_k, device=dev, dtype=torch.int32),
             "out": torch.empty(q.shape[0], p.heads_q, p.head_dim_v, device=dev, dtype=dt),
             "lse": torch.empty(p.heads_q, q.shape[0], device=dev, dtype=torch.float32)}
        for n, x in (("kp", k), ("vp", v)):
            rows = torch.zeros(p.batch, per_seq * page, *x.shape[1:], device=dev, dtype=dt)
            rows[:, :p.seqlen_k] = x.reshape(p.batch, p.seqlen_k, *x.shape[1:])
            pages = torch.empty(p.batch * per_seq, page, *x.shape[1:], device=dev, dtype=dt)
            pages[perm] = rows.reshape(p.batch * per_seq, page, *x.shape[1:])
            t[n] = pages
        return t

    def launch(self, obj, cfg, t: dict) -> None:
        """Config `cfg` on input set `t`: its launch made once per (config, input set) and replayed
        (families.base.replay)."""
        from attngen.families.base import replay

        replay(self, obj, cfg, t)

    def steps(self, obj, cfg, t: dict) -> list:
        return _pp.prefill_paged_launches(obj.mod, obj.spec, t["q"], t["kp"], t["vp"], t["out"], t["lse"], t["cu_q"],
                                          None, t["used"], t["table"], obj.problem.seqlen_q, obj.mask, cfg)

    def reference(self, obj, t: dict) -> dict:
        from attngen.problem import grouped_reference, output_chunk

        p = self._packed(obj)
        return grouped_reference(p, obj.spec.gqa_ratio, t, lambda *a: output_chunk(p, *a), REF_CHUNK, obj.device)

    def check(self, obj, name: str, t: dict, ref: dict) -> None:
        from attngen.testing import assert_flash_rule, assert_lse_close

        assert_flash_rule(f"{name} out", t["out"], ref["out64"], ref["out_pt"], self.factor, 1e-5)
        assert_lse_close(f"{name} lse", t["lse"], ref["lse64"])
