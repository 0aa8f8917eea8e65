"""The fp8 forward family's PyTorch side (attngen.families.fwd_fp8): the same computation in
PyTorch -- rotation, block quantization, attention with P rounded to e4m3 (emulate) -- which sets
the error budget of the flash-attn rule, the rule itself for fp8 outputs (check_outputs), and the
tuning hooks. Imported by the tuner, the tests and the benchmark, never by the runtime."""

from __future__ import annotations

from attngen.families.fwd_fp8 import (E4M3_MAX, ROTATION_SEED, SCALE_BLOCK, alloc, buffers, fp8_launches,
                                      key_order16, prologue_launch, q_in_kernel, qk_width, rotation, rotation_blocks,
                                      signed_hadamard)


# ------------------------------------------------------------------------------------------------
# the same computation in PyTorch: the reference the flash-attn rule compares with (error of the
# kernel <= factor x error of this, both against float64 on the unquantized inputs)


def rotation_matrix(head_dim: int, seed: int = ROTATION_SEED):
    """M (head_dim x qk_width, float64): x (.., head_dim) -> x M is what the prologue computes
    before quantizing (zero padding to qk_width, then diag(s) H / sqrt(w) per block)."""
    import torch

    w = -(-head_dim // 16) * 16
    norm = torch.zeros(w, dtype=torch.float64)
    for off, bw in rotation_blocks(w):
        norm[off:off + bw] = bw ** -0.5
    return (signed_hadamard(w, seed) * norm[None, :])[:head_dim]


def quantize_ref(x, block: int = SCALE_BLOCK):
    """(e4m3 values as float64, descales) of x (.., S, D) per block of `block` rows: x8 =
    e4m3(x / d), d = amax / 448 (1 for an all-zero block), round to nearest even."""
    import torch

    *lead, S, D = x.shape
    nb = -(-S // block)
    xp = torch.nn.functional.pad(x.double(), (0, 0, 0, nb * block - S)).reshape(*lead, nb, block, D)
    amax = xp.abs().amax(dim=(-1, -2), keepdim=True).float()
    d = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q8 = (xp.float() / d).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q8.double().reshape(*lead, nb * block, D)[..., :S, :], d.reshape(*lead, nb)


def dequantize_ref(x8, d, block: int = SCALE_BLOCK):
    return x8 * d.double().repeat_interleave(block, dim=-1)[..., :x8.shape[-2], None]


def emulate(q, k, v, *, rotate: bool = True, seed: int = ROTATION_SEED, causal=False, window_size=(-1, -1),
            softcap=0.0, scale=None, top_left=False, q_rows: bool = False):
    """fp8 attention as the kernels compute it, in PyTorch on (B, H, S, D) tensors: Q and K rotated
    (rotate=True) and block-quantized (q_rows: Q with one descale per row, as the Gluon kernel
    quantizes it inside), V block-quantized, scores and softmax in fp32, P (times 2^8) rounded to
    e4m3, P.V in fp32. Returns (out in q's dtype, lse fp32)."""
    import torch

    from attngen.problem import keep_mask

    dtype, D = q.dtype, q.shape[-1]
    if rotate:
        m = rotation_matrix(D, seed).to(q.device)
        q, k = q.double() @ m, k.double() @ m
    qb = 1 if q_rows else SCALE_BLOCK
    qd = dequantize_ref(*quantize_ref(q, qb), qb).float()
    kd = dequantize_ref(*quantize_ref(k)).float()
    vd = dequantize_ref(*quantize_ref(v)).float()
    g = qd.shape[1] // kd.shape[1]
    kd, vd = kd.repeat_interleave(g, dim=1), vd.repeat_interleave(g, dim=1)
    scale = scale if scale is not None else 1.0 / D ** 0.5
    s = (qd @ kd.transpose(-1, -2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    keep = keep_mask(q.shape[2], k.shape[2], causal, window_size, top_left, device=q.device)
    s = s.masked_fill(~keep, float("-inf"))
    mx = s.amax(-1, keepdim=True)
    mx = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)
    p = torch.exp(s - mx)
    l = p.sum(-1, keepdim=True)
    p8 = (p * 256).to(torch.float8_e4m3fn).float() / 256
    out = (p8 @ vd) / torch.where(l == 0, torch.ones_like(l), l)
    lse = torch.where(l[..., 0] == 0, torch.full_like(l[..., 0], float("-inf")), (mx + l.log())[..., 0])
    return out.to(dtype), lse


# ------------------------------------------------------------------------------------------------
# tuning hooks: what the tuner's objective (attngen.tuning.objective) needs of this family


class TuningHooks:
    """bf16 / fp16 inputs (the forward family's), quantized by the prologue inside the timed
    launch (its time counts); the reference: float64 attention of the unquantized inputs, the
    PyTorch emulation (emulate) for the error budget; throughput in TFLOP/s."""

    factor = 2.0
    outputs = ("out", "lse")
    unit = "TFLOP/s"

    def throughput(self, obj, ms: float) -> float:
        return obj.problem.flops() * obj.family.flop_factor / ms / 1e9

    def inputs(self, obj, seed: int) -> dict:
        from attngen.families.fwd_tuning import TuningHooks as FwdHooks

        t = FwdHooks().inputs(obj, seed)
        s = obj.spec
        cu = (t["cu_q"], t["cu_k"]) if s.varlen else (None, None)
        mx = (obj.problem.seqlen_q, obj.problem.seqlen_k)
        # the fp8 buffers (Q8, K8, Vt, the descales) beside the inputs: one flat dict of tensors
        t.update(alloc(buffers(s, t["q"], t["k"], t["v"], s.varlen, *mx, cu_q=cu[0]), obj.device))
        t["rot"] = rotation(qk_width(s), ROTATION_SEED, t["q"].dtype, obj.device)
        return t

    def launch(self, obj, cfg, t: dict) -> None:
        """The prologue's and the attention's launches of config `cfg` on input set `t`, made once
        per (config, input set) and replayed as the runtime replays a plan (CompiledLaunch):
        building them and going through Triton's JIT (the Gluon kernel's descriptors validated
        again) on every timed step cost more host time than a short bucket's kernels take, and a
        tuning run picked Triton configs by Python time (q4096 causal GQA 32/8: every Gluon config
        at 0.86 ms, the bench's kernel at about 0.27)."""
        from attngen.families.base import replay

        replay(self, obj, cfg, t)

    def steps(self, obj, cfg, t: dict) -> list:
        s, p = obj.spec, obj.problem
        cu_q, cu_k = (t["cu_q"], t["cu_k"]) if s.varlen else (None, None)
        # dense calls: the Gluon kernel may quantize Q itself, as the runtime's plan lets it
        attn = fp8_launches(obj.mod, s, t["Q8"], t["K8"], t["Vt"], t["QScale"], t["KScale"], t["VScale"],
                            t["out"], t["lse"], obj.mask, cfg, cu_q, cu_k, p.seqlen_q,
                            q16=None if s.varlen else t["q"], rot=t["rot"])
        # the prologue as the runtime's plan launches it: one launch, Q left out where the attention
        # kernel quantizes it
        quant = prologue_launch(obj.mod, s, t["q"], t["k"], t["v"], t, t["rot"], cu_q, cu_k, p.seqlen_q, p.seqlen_k,
                                key_order16(obj.mod, attn), quant_q=not q_in_kernel(attn))
        return [quant] + attn

    def reference(self, obj, t: dict) -> dict:
        """Per (batch or document): float64 attention and the emulation."""
        import torch

        from attngen.problem import attention_ref

        p, s = obj.problem, obj.spec
        kw = dict(causal=p.causal, window_size=p.window, softcap=p.softcap, scale=p.softmax_scale)
        outs = {"out64": [], "lse64": [], "out_pt": [], "lse_pt": []}
        for b in range(p.batch):
            if s.varlen:
                q, k, v = (t[n][r].transpose(0, 1)[None] for n, r in
                           (("q", slice(b * p.seqlen_q, (b + 1) * p.seqlen_q)),
                            ("k", slice(b * p.seqlen_k, (b + 1) * p.seqlen_k)),
                            ("v", slice(b * p.seqlen_k, (b + 1) * p.seqlen_k))))
            else:
                q, k, v = (t[n][b:b + 1] for n in ("q", "k", "v"))
            for n, x in zip(("out64", "lse64", "out_pt", "lse_pt"),
                            (*by_head_chunks(attention_ref, q, k, v, kw), *by_head_chunks(emulate, q, k, v, kw))):
                outs[n].append(x)
        if s.varlen:  # (1, H, S, D) per document -> (T, H, D); lse (1, H, S) -> (H, T)
            return {n: (torch.cat([x[0].transpose(0, 1) for x in xs]) if n.startswith("out")
                        else torch.cat([x[0] for x in xs], dim=1)) for n, xs in outs.items()}
        return {n: torch.cat(xs) for n, xs in outs.items()}

    def check(self, obj, name: str, t: dict, ref: dict) -> None:
        check_outputs(name, t["out"], t["lse"], ref, self.factor)


REF_SCORE_BYTES = 2 << 30  # the most a reference's float64 score matrix may take at once


def by_head_chunks(fn, q, k, v, kw: dict):
    """fn(q, k, v, **kw) -> (out (1, H, Sq, D), lse (1, H, Sq)) over groups of query heads whose
    float64 scores fit REF_SCORE_BYTES (a bucket of 32 heads at 16k x 16k would need 64 GiB);
    a group holds whole GQA groups, so each chunk of q sees its own K / V heads."""
    import torch

    hq, hkv = q.shape[1], k.shape[1]
    g = hq // hkv
    per_head = q.shape[2] * k.shape[2] * 8
    step = g * max(1, REF_SCORE_BYTES // (per_head * g))
    if step >= hq:
        return fn(q, k, v, **kw)
    parts = [fn(q[:, h:h + step], k[:, h // g:(h + step) // g], v[:, h // g:(h + step) // g], **kw)
             for h in range(0, hq, step)]
    return torch.cat([o for o, _ in parts], dim=1), torch.cat([lse for _, lse in parts], dim=1)


def check_outputs(name: str, out, lse, ref: dict, factor: float = 2.0) -> None:
    """The flash-attn rule against the emulation, for the output and for the finite LSE values
    (-inf exactly where the reference has it)."""
    import torch

    from attngen.testing import assert_flash_rule

    assert_flash_rule(f"{name} out", out, ref["out64"], ref["out_pt"], factor, 1e-4)
    ninf = torch.isneginf(ref["lse64"].to(lse.device))
    if not torch.equal(ninf, torch.isneginf(lse)):
        raise AssertionError(f"{name} lse: -inf at {int(torch.isneginf(lse).sum())} places, reference at "
                             f"{int(ninf.sum())}")
    fin = ~ninf
    assert_flash_rule(f"{name} lse", lse[fin], ref["lse64"].to(lse.device)[fin], ref["lse_pt"].to(lse.device)[fin],
                      factor, 1e-3)
