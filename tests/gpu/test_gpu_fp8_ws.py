"""The warp-specialized Gluon fp8 forward (`_attn_fwd_fp8_ws`, fwd_fp8 family) on the GPU.

Correctness: the prologue (rotation + block quantization) and the Gluon kernel on odd shapes,
against float64 attention of the unquantized inputs with the PyTorch emulation of the same fp8
computation as the yardstick (fwd_fp8_tuning.check_outputs: the flash-attn rule, factor 2, and -inf LSE
exactly where the reference has it). Throughput: the attention kernel alone (the prologue timed on
its own) at B1 H16 hd128, non-causal, S 4096 and 16384, for several Gluon configs beside the Triton
fp8 kernel's default, TFLOP/s = 4 S^2 D H / time (triton.testing.do_bench, median); each row is a
record in the session summary ($ATTNGEN_GPU_SUMMARY) and printed.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import pytest
import torch

from attngen.families import fwd_fp8 as F
from attngen.families import fwd_fp8_tuning as f8t
from attngen.kernels.common import MaskArgs, mask_kind
from attngen.problem import attention_ref, random_inputs
from attngen.runtime import loader
from attngen.spec import KernelSpec

pytestmark = pytest.mark.gpu

BF16, FP16 = torch.bfloat16, torch.float16


@dataclass(frozen=True)
class Case:
    B: int
    Hq: int
    Hkv: int
    Sq: int
    Sk: int
    D: int
    causal: bool = False
    window: tuple[int, int] = (-1, -1)
    dtype: torch.dtype = BF16
    cfg: F.Fp8Config | None = field(default=None)  # None: fwd_fp8.ws_fp8_default

    @property
    def id(self) -> str:
        mask = "causal" if self.causal else "full"
        if self.window != (-1, -1):
            mask += f"-win{self.window[0]}_{self.window[1]}"
        c = self.cfg
        cfg = f"-{c.block_m}x{c.block_n}s{c.num_stages}c{c.consumers}" if c else ""
        return (f"{'bf16' if self.dtype == BF16 else 'fp16'}-b{self.B}-h{self.Hq}_{self.Hkv}-q{self.Sq}-k{self.Sk}"
                f"-d{self.D}-{mask}{cfg}")

    @property
    def spec(self) -> KernelSpec:
        mask, _, _ = mask_kind(self.causal, self.window)
        return KernelSpec("fwd_fp8", "fp8_e4m3", "sm90", self.D, self.D, self.Hq // self.Hkv, mask)


CASES = [
    Case(2, 4, 4, 113, 113, 64),
    Case(1, 8, 2, 203, 203, 128, causal=True),
    Case(1, 4, 1, 1023, 1023, 128, window=(255, 0), causal=True),
    Case(1, 8, 8, 4096, 4096, 128, dtype=FP16),
    Case(1, 8, 2, 4096, 4096, 64, causal=True),
    Case(2, 4, 4, 203, 1023, 128, causal=True),  # Sq < Sk: bottom-right diagonal
    Case(1, 4, 4, 1023, 203, 64, causal=True),  # Sq > Sk: rows that see no key (O = 0, lse = -inf)
    Case(1, 4, 1, 4096, 4096, 128, window=(128, 128)),
    Case(1, 4, 4, 1023, 4096, 64, window=(-1, 256)),
    Case(1, 8, 2, 1023, 1023, 128, cfg=F.Fp8Config(64, 128, 4, 2, consumers=1)),
    Case(1, 4, 4, 4096, 4096, 128, causal=True, cfg=F.Fp8Config(128, 64, 4, 4, consumers=2)),
    Case(1, 4, 2, 1023, 1023, 256, causal=True),
]


def mask_args(c: Case) -> MaskArgs:
    _, wl, wr = mask_kind(c.causal, c.window)
    return MaskArgs(scale=1.0 / math.sqrt(c.D), softcap=0.0, window_left=wl, window_right=wr, align_top_left=False)


def prepare(c: Case, q, k, v, cfg: F.Fp8Config, fused: bool = False, rotate: bool = True):
    """(prologue launches, attention launches, out, lse) of one call: the launchers' own. fused:
    the attention kernel quantizes Q itself (given the 16-bit q), the prologue only K and V;
    rotate=False: no rotation. Outputs poisoned with NaN."""
    spec = c.spec
    mod = loader.load(spec)
    bufs = F.alloc(F.buffers(spec, q, k, v, False), q.device)
    rot = F.rotation(F.qk_width(spec), F.ROTATION_SEED, q.dtype, q.device) if rotate else None
    out = torch.full((c.B, c.Hq, c.Sq, c.D), float("nan"), device=q.device, dtype=q.dtype)
    lse = torch.full((c.B, c.Hq, c.Sq), float("nan"), device=q.device, dtype=torch.float32)
    attn = F.fp8_launches(mod, spec, bufs["Q8"], bufs["K8"], bufs["Vt"], bufs["QScale"], bufs["KScale"],
                          bufs["VScale"], out, lse, mask_args(c), cfg, q16=q if fused else None, rot=rot)
    assert F.q_in_kernel(attn) is fused, (c.id, cfg)
    quant = F.quant_launches(mod, spec, q, k, v, bufs, rot, perm16=F.key_order16(mod, attn))
    return (quant[1:] if fused else quant), attn, out, lse


def inputs(c: Case, seed: int = 0):
    return random_inputs((c.B, c.Hq, c.Sq, c.D), (c.B, c.Hkv, c.Sk, c.D), (c.B, c.Hkv, c.Sk, c.D), dtype=c.dtype,
                         device="cuda", seed=seed)


@pytest.mark.parametrize("fused", [False, True], ids=["q8", "q-inside"])
@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_fp8_gluon_forward_matches_float64_within_the_emulation_budget(c: Case, fused: bool, gpu_records):
    """Both ways the Gluon kernel gets Q: the prologue's Q8 (attention_fp8's way, and where the
    rotation's blocks do not fit) and quantized inside (attention(precision="fp8")'s: one descale
    per row, emulated as such)."""
    t0 = time.perf_counter()
    rec = {"kind": "fwd_fp8_ws", "id": c.id + ("-qin" if fused else ""), "passed": False, "seconds": 0.0}
    gpu_records.append(rec)
    cfg = c.cfg or F.ws_fp8_default(c.spec)
    q, k, v = inputs(c)
    quant, attn, out, lse = prepare(c, q, k, v, cfg, fused)
    assert [la.fn.__name__ for la in attn] == ["_attn_fwd_fp8_ws"], (c.id, attn)
    for la in quant + attn:
        la.run()
    torch.cuda.synchronize()
    kw = dict(causal=c.causal, window_size=c.window)
    o64, l64 = attention_ref(q, k, v, **kw)
    opt, lpt = f8t.emulate(q, k, v, **kw, q_rows=fused)
    f8t.check_outputs(c.id, out, lse, {"out64": o64, "lse64": l64, "out_pt": opt, "lse_pt": lpt})
    err = (out.double() - o64).abs().max().item()
    rec.update(passed=True, err=err, emu_err=(opt.double() - o64).abs().max().item(),
               seconds=round(time.perf_counter() - t0, 2))


@pytest.mark.parametrize("c", [CASES[1], CASES[-1], CASES[-3]], ids=lambda c: c.id)
def test_fp8_gluon_forward_quantizes_q_inside_without_rotation(c: Case):
    """rotate=False with Q quantized inside: Q's tiles go straight from shared memory to the
    per-row quantization (no rotation read); against float64 within the budget of the same
    computation without rotation."""
    cfg = c.cfg or F.ws_fp8_default(c.spec)
    q, k, v = inputs(c, seed=3)
    quant, attn, out, lse = prepare(c, q, k, v, cfg, fused=True, rotate=False)
    assert attn[0].values["QUANT_Q"] and not attn[0].values["ROTATE"]
    for la in quant + attn:
        la.run()
    torch.cuda.synchronize()
    kw = dict(causal=c.causal, window_size=c.window)
    o64, l64 = attention_ref(q, k, v, **kw)
    opt, lpt = f8t.emulate(q, k, v, **kw, rotate=False, q_rows=True)
    f8t.check_outputs(c.id, out, lse, {"out64": o64, "lse64": l64, "out_pt": opt, "lse_pt": lpt})


# the configs timed beside the Triton kernel's default (consumers = 0)
TIMED = [
    F.Fp8Config(128, 128, 4, 2, consumers=2),
    F.Fp8Config(128, 128, 4, 3, consumers=2),
    F.Fp8Config(128, 64, 4, 3, consumers=2),
    F.Fp8Config(64, 128, 4, 2, consumers=1),
]
# (S, head dim, causal, Gluon configs): B1 H16
TIMINGS = [
    (4096, 128, False, TIMED),
    (16384, 128, False, TIMED),
    (16384, 128, True, [F.WS_FP8_DEFAULT, F.Fp8Config(128, 128, 4, 3, consumers=2)]),
    (4096, 128, True, [F.WS_FP8_DEFAULT, F.WS_FP8_ONE]),
    (16384, 64, False, [F.WS_FP8_DEFAULT, F.Fp8Config(128, 128, 4, 3, consumers=2)]),
    (16384, 256, False, [F.WS_FP8_DEFAULT_WIDE, F.Fp8Config(128, 64, 4, 3, consumers=2)]),
]


def _time(launches) -> float:
    import triton

    for la in launches:
        la.run()
        la.descriptors = None  # made once (values keep them): time the kernel, not the host
    return triton.testing.do_bench(lambda: [la.run() for la in launches], return_mode="median")


@pytest.mark.parametrize("S, D, causal, configs", TIMINGS, ids=[f"s{t[0]}-d{t[1]}-{'causal' if t[2] else 'full'}"
                                                                for t in TIMINGS])
def test_fp8_gluon_forward_throughput(S, D, causal, configs, gpu_records):
    """TFLOP/s of the attention kernel (and of the prologue) per config, the Triton fp8 kernel's
    default first; the Gluon kernel's output agrees with the Triton kernel's on the same fp8
    tensors (relative L2 difference under 5 %)."""
    c = Case(1, 16, 16, S, S, D, causal=causal)
    q, k, v = inputs(c, seed=1)
    pairs = S * (S + 1) / 2 if causal else S * S
    flops = 4.0 * pairs * D * c.Hq
    rows, ref_out = [], None
    for cfg in [F.triton_fp8_config(c.spec), *configs]:
        t0 = time.perf_counter()
        quant, attn, out, lse = prepare(c, q, k, v, cfg)
        for la in quant:
            la.run()
        ms = _time(attn)
        kernel = attn[0].fn.__name__
        torch.cuda.synchronize()
        assert torch.isfinite(out).all() and not torch.isnan(lse).any(), (cfg, kernel)
        if ref_out is None:
            ref_out = out.float().clone()
        diff = ((out.float() - ref_out).norm() / ref_out.norm()).item()
        row = {"kind": "fwd_fp8_ws_tflops", "id": c.id, "kernel": kernel, "config": cfg.as_dict(),
               "ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1), "rel_diff_to_triton": round(diff, 5),
               "passed": diff < 0.05, "seconds": round(time.perf_counter() - t0, 2)}
        rows.append(row)
        gpu_records.append(row)
    quant, *_ = prepare(c, q, k, v, configs[0])
    pro_ms = _time(quant)
    gpu_records.append({"kind": "fwd_fp8_prologue", "id": c.id, "ms": round(pro_ms, 4), "passed": True,
                        "seconds": 0.0})
    print(f"\n{c.id}: prologue {pro_ms:.3f} ms")
    for r in rows:
        cfg = r["config"]
        print(f"  {r['kernel']:18s} {cfg['block_m']}x{cfg['block_n']} w{cfg['num_warps']} s{cfg['num_stages']} "
              f"c{cfg['consumers']}: {r['ms']:.3f} ms {r['tflops']:7.1f} TFLOP/s (with prologue "
              f"{flops / (r['ms'] + pro_ms) / 1e9:7.1f}); rel diff to Triton {r['rel_diff_to_triton']}")
    bad = [r for r in rows if not r["passed"]]
    assert not bad, bad


@pytest.mark.parametrize("D, cfg", [(128, F.WS_FP8_ONE), (128, F.WS_FP8_DEFAULT), (256, F.WS_FP8_DEFAULT_WIDE)])
def test_causal_tile_orders_compute_the_same_output(monkeypatch, D, cfg):
    """The Gluon kernel's two causal program orders (fwd_fp8.lpt_order: LPT where K / V fit in L2,
    else one (batch, head)'s tiles side by side) run the same tiles: outputs and LSE bit for bit
    equal, on an odd shape with GQA, each against float64 through the flash-attn rule."""
    import attngen
    from attngen.runtime import dispatch
    from attngen.runtime import fp8 as rt_fp8

    q, k, v = random_inputs((2, 8, 1531, D), (2, 2, 1531, D), (2, 2, 1531, D), dtype=BF16, device="cuda", seed=41)
    got = {}
    for lpt in (True, False):
        monkeypatch.setattr(F, "lpt_order", lambda spec, k8, lpt=lpt: lpt)
        rt_fp8._FAST.clear(), rt_fp8._PLANS.clear()
        with dispatch.forced_config(fwd_fp8=cfg):
            got[lpt] = attngen.attention(q, k, v, causal=True, precision="fp8", return_lse=True)
        plan = list(rt_fp8._PLANS.values())[-1]
        la = plan.launches[-1]
        names = [n for n, _ in plan.module.ABI[la.fn.__name__]][len(la.tensor_names):]
        assert la.fn.__name__ == "_attn_fwd_fp8_ws" and dict(zip(names, la.tail))["LPT"] is lpt
    assert torch.equal(got[True][0], got[False][0]) and torch.equal(got[True][1], got[False][1])
    ref, _ = attention_ref(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), causal=True)
    emul, _ = f8t.emulate(q, k, v, causal=True)
    from attngen.testing import assert_flash_rule

    assert_flash_rule("out", got[True][0], ref, emul, 2.0, 1e-3)


def test_lpt_order_follows_the_l2_footprint(monkeypatch):
    """Causal calls whose e4m3 K and V^T take up to 0.8 of L2 walk tiles in LPT order; larger ones,
    and other masks, keep one (batch, head)'s tiles together."""
    import types

    monkeypatch.setattr(F, "_l2_bytes", lambda index: 50 << 20)
    spec = KernelSpec("fwd_fp8", "fp8_e4m3", "sm90", 128, 128, 1, "causal")

    def k8(B, H, S, D):
        return types.SimpleNamespace(device=torch.device("cuda", 0), shape=(B, H, S, D))

    assert F.lpt_order(spec, k8(1, 16, 8192, 128)) and not F.lpt_order(spec, k8(1, 16, 16384, 128))
    assert not F.lpt_order(KernelSpec("fwd_fp8", "fp8_e4m3", "sm90", 128, 128, 1, "none"), k8(1, 1, 64, 128))
