"""The warp-specialized Gluon fp8 forward (`_attn_fwd_fp8_ws`, templates/_fp8_ws.py.jinja) compiled
for sm90 on a CPU machine (attngen.bench.probe, Triton's own ptxas): its matmuls are fp8 wgmmas
(e4m3 x e4m3 into fp32), Q.K^T is waited for with one wgmma group in flight in the PTX (block
j-1's P.V; ptxas then waits for it too before the softmax's exponentials: the probe's main_loop
reports where, docs/notes.md), P reaches P.V without shuffles or byte permutes (its layout change
is a key reorder the prologue matches), nothing spills under the launch register cap, the shared
memory is the model's, and the main loop holds one key block's work: its wgmmas and one ex2 per
score (plus the two rows' rescale factors)."""

from __future__ import annotations

import pytest

from .test_compile_sm90 import probe


@pytest.mark.parametrize("hd, mask, gqa, config", [
    (128, "none", 1, "128,128,4,3,consumers=2"),
    (64, "causal", 4, "128,128,4,2,consumers=2"),
    (128, "sliding_window", 1, "64,128,4,2,consumers=1"),
    (256, "causal", 2, "128,64,4,2,consumers=2"),
])
def test_fp8_gluon_forward_is_fp8_wgmma_with_a_matmul_in_flight(hd, mask, gqa, config):
    import torch

    from attngen.families.fwd_fp8 import Fp8Config, check_fp8, ws_fp8_maxnreg, ws_quant_q, ws_smem_bytes
    from attngen.spec import KernelSpec

    nums = [int(x) for x in config.split(",") if "=" not in x]
    cfg = Fp8Config(*nums, consumers=int(config.rsplit("=", 1)[1]))
    spec = KernelSpec("fwd_fp8", "fp8_e4m3", "sm90", hd, hd, gqa, mask)
    assert check_fp8(spec, cfg) is None, check_fp8(spec, cfg)
    q16 = torch.empty(1, 1, 1, hd, dtype=torch.bfloat16)
    reports = probe("fwd_fp8", "--hd", str(hd), "--gqa", str(gqa), "--mask", mask, "--config", config)
    # the prologue's three kernels, the runtime's one-launch prologue, the attention kernel on the
    # prologue's Q8, and the one that quantizes Q itself (attention(precision="fp8")'s, where its
    # shared memory fits)
    prologue, whole, ws, fused = reports[:3], reports[3], reports[4], reports[5:]
    assert whole["kernel"] == "_fp8_quant_qkv" and whole["spill_stores"] == 0, whole
    assert whole["griddepcontrol"] == ["launch_dependents"], whole
    assert len(fused) == (1 if ws_quant_q(spec, cfg, q16, q16, True) else 0), reports
    # the prologue (Q rotated, V, Q not rotated) compiles without spilling
    assert [r["kernel"] for r in prologue] == ["_fp8_quant_qk", "_fp8_quant_v", "_fp8_quant_qk"], prologue
    assert all(r.get("spill_stores") == 0 for r in prologue), prologue
    # every e4m3 store 16 bytes wide (the one 4-byte store: the block's descale), V^T's transposed
    # rows included: its mask is taken per 16 keys, its key order made by moving values
    assert all(set(r["global_stores"]) == {"b32", "v4.b32"} and r["global_stores"]["b32"] == 1
               for r in prologue), prologue
    # programmatic dependent launch (as an sm90 GPU runs them): each prologue kernel lets the next
    # launch start, the attention kernel is launched with the attribute and every partition (the
    # consumers and the producer) waits for the prologue before its first global read
    assert all(r["griddepcontrol"] == ["launch_dependents"] for r in prologue), prologue
    assert ws["launch_pdl"] and ws["griddepcontrol"] == ["wait"] * (cfg.consumers + 1), ws
    assert ws["wait_before_reads"], ws
    assert ws["kernel"] == "_attn_fwd_fp8_ws", ws
    assert ws["wgmma_types"] == ["f32.e4m3.e4m3"] and all("k32" in w for w in ws["wgmma"]), ws
    assert 1 in ws["wait_groups"], ws  # Q.K^T waited for with P.V in flight
    # Q8 in registers up to hd128 (A operand of Q.K^T), P always (A operand of P.V)
    assert any("A from registers" in w for w in ws["wgmma"]), ws
    assert ws["byte_permutes"] == 0, ws
    if hd <= 128:
        assert not any("A from shared" in w for w in ws["wgmma"]), ws
    assert ws["spill_stores"] == 0 and ws["registers"] <= ws_fp8_maxnreg(spec, cfg), ws
    want = ws_smem_bytes(spec, cfg)
    assert want <= ws["shared_bytes"] <= want + 1024, (want, ws)
    # the main loop: Q.K^T in k32 steps over the qk width, P.V in k32 steps over the key block;
    # 64 rows x block_n scores over a warp group's 128 threads, one ex2 each, and alpha's for the
    # thread's two rows; nothing in local memory
    width = -(-hd // 16) * 16
    loop_bars = ws["main_loop"]["bar_sync"]  # quantizing Q adds no barrier to the key loop
    for rep in [ws, *fused]:
        loop = rep["main_loop"]
        assert loop is not None, rep
        assert loop["wgmma"] == width // 32 + cfg.block_n // 32, loop
        assert loop["ex2"] == 64 * cfg.block_n // 128 + 2, loop
        assert loop["local_memory"] == 0 and loop["waits"] >= 2 and loop["bar_sync"] == loop_bars, loop
    for rep in fused:
        # Q quantized inside: its rotation a bf16 wgmma a column tile of 64 (A from shared memory,
        # the tile as TMA left it) before the main loop, which is the other kernel's; the caller's q
        # and the rotation come by TMA before the wait for the prologue, no pointer load before it
        assert rep["kernel"] == "_attn_fwd_fp8_ws", rep
        assert rep["wgmma_types"] == ["f32.bf16.bf16", "f32.e4m3.e4m3"], rep
        assert f"m64n{min(width, 64)}k16 A from shared" in rep["wgmma"], rep
        assert rep["launch_pdl"] and rep["griddepcontrol"] == ["wait"] * (cfg.consumers + 1), rep
        assert rep["reads_before_wait"]["ld.global"] == 0 and rep["reads_before_wait"]["tma"] >= 1, rep
        assert rep["byte_permutes"] == 0 and rep["spill_stores"] == 0, rep
        assert rep["registers"] <= ws_fp8_maxnreg(spec, cfg), rep
        want = ws_smem_bytes(spec, cfg, rot=True)
        assert want <= rep["shared_bytes"] <= want + 1024, (want, rep)


def test_fp8_gluon_forward_exists_where_ws_fp8_says():
    """Dense sm90 specs of qk width and v head dim 64, 128 or 256 without softcapping get the
    Gluon kernel; packed documents, softcapping and other head dims keep the Triton kernel only,
    and a Gluon config is refused there (check_fp8 names the reason)."""
    from attngen.codegen.render import render
    from attngen.families.fwd_fp8 import WS_FP8_DEFAULT_WIDE, check_fp8, ws_fp8
    from attngen.spec import KernelSpec

    def spec(hd=128, hd_v=None, **kw):
        return KernelSpec("fwd_fp8", "fp8_e4m3", "sm90", hd, hd_v or hd, 2, "causal", **kw)

    # hd120: Q8 / K8 are 128 wide (qk_width), V^T keeps its 120 rows
    for s, want in ((spec(), True), (spec(64), True), (spec(256), True), (spec(120, 128), True),
                    (spec(120), False), (spec(96), False),
                    (spec(softcap=True), False), (spec(varlen=True), False)):
        assert ws_fp8(s) is want, s
        src = render(s)
        assert ("_attn_fwd_fp8_ws" in src) is want and ("gluon" in src) is want, s
        assert (check_fp8(s, WS_FP8_DEFAULT_WIDE) is None) is want, (s, check_fp8(s, WS_FP8_DEFAULT_WIDE))


def test_fp8_launcher_takes_the_gluon_kernel_where_it_can_and_falls_back():
    """fp8_launches with a Gluon config: the Gluon launch (descriptors over Q8, K8, V^T and O,
    the launch register cap) where a GPU may run it (here: gluon=True, as the compile probe says);
    the Triton kernel with its own default config on the CPU and for an output whose rows the copy
    engine cannot address."""
    import math

    import torch

    from attngen.families import fwd_fp8 as F
    from attngen.families.base import WS_MAXNREG
    from attngen.kernels.common import MaskArgs, mask_kind
    from attngen.runtime import loader
    from attngen.spec import KernelSpec

    spec = KernelSpec("fwd_fp8", "fp8_e4m3", "sm90", 128, 128, 2, "causal")
    mod = loader.load(spec)
    B, hkv, S, D = 1, 2, 300, 128
    q, k, v = torch.empty(B, 2 * hkv, S, D), torch.empty(B, hkv, S, D), torch.empty(B, hkv, S, D)
    bufs = F.alloc(F.buffers(spec, q, k, v, False), "cpu")
    _, wl, wr = mask_kind(True, (-1, -1))
    margs = MaskArgs(1 / math.sqrt(D), 0.0, wl, wr, False)
    cfg = F.default_fp8_config(spec)
    assert cfg == F.WS_FP8_DEFAULT and cfg.consumers == 2
    # short calls: one consumer a program (causal up to 8192 query rows, no mask up to 4096)
    assert F.default_fp8_config(spec, "cuda", 8192) == F.WS_FP8_ONE
    assert F.default_fp8_config(spec, "cuda", 16384) == F.WS_FP8_DEFAULT
    full = KernelSpec("fwd_fp8", "fp8_e4m3", "sm90", 128, 128, 2, "none")
    assert [F.default_fp8_config(full, "cuda", s) for s in (4096, 8192)] == [F.WS_FP8_ONE, F.WS_FP8_DEFAULT]
    window = KernelSpec("fwd_fp8", "fp8_e4m3", "sm90", 128, 128, 2, "sliding_window")
    assert F.default_fp8_config(window, "cuda", 1024) == F.WS_FP8_DEFAULT  # not measured: unchanged
    wide = KernelSpec("fwd_fp8", "fp8_e4m3", "sm90", 256, 256, 1, "causal")
    assert F.default_fp8_config(wide, "cuda", 1024) == F.WS_FP8_DEFAULT_WIDE
    assert all(F.check_fp8(x, F.default_fp8_config(x, "cuda", 2048)) is None for x in (spec, full, window, wide))

    def launch(out, gluon, **kw):
        lse = torch.empty(B, 2 * hkv, S)
        (la,) = F.fp8_launches(mod, spec, bufs["Q8"], bufs["K8"], bufs["Vt"], bufs["QScale"], bufs["KScale"],
                               bufs["VScale"], out, lse, margs, cfg, gluon=gluon, **kw)
        return la

    out = torch.empty(B, 2 * hkv, S, D, dtype=torch.bfloat16)
    ws = launch(out, True)
    assert ws.fn.__name__ == "_attn_fwd_fp8_ws" and ws.maxnreg == WS_MAXNREG and ws.num_warps == 4
    assert ws.grid == math.ceil(S / 128) * B * 2 * hkv
    assert sorted(ws.descriptors) == ["desc_k", "desc_o", "desc_q", "desc_r", "desc_v"]
    # Q8 from the prologue: no rotation read (desc_r is desc_q again), Q not quantized inside
    assert ws.descriptors["desc_r"] == ws.descriptors["desc_q"] and ws.descriptors["desc_q"][0] == "Q"
    assert not ws.values["QUANT_Q"] and not ws.values["ROTATE"] and not F.q_in_kernel([ws])
    # given the 16-bit q (attention(precision="fp8")): the Gluon kernel quantizes Q itself, reading q in
    # column tiles of 64 and the rotation's 64 x 64 diagonal blocks; without a rotation only q
    q16 = q.to(torch.bfloat16)
    rot = F.rotation(D, F.ROTATION_SEED, q16.dtype, "cpu")
    fused = launch(out, True, q16=q16, rot=rot)
    assert fused.values["QUANT_Q"] and fused.values["ROTATE"] and F.q_in_kernel([fused])
    assert fused.descriptors["desc_q"][0] == "q" and fused.descriptors["desc_q"][3] == [1, 1, 64, 64]
    assert fused.descriptors["desc_r"][0] == "Rot" and fused.descriptors["desc_r"][3] == [1, 1, 64, 64]
    plain = launch(out, True, q16=q16, rot=None)
    assert plain.values["QUANT_Q"] and not plain.values["ROTATE"]
    assert plain.descriptors["desc_r"] == plain.descriptors["desc_q"]
    # not inside: q of another dtype than O (O's buffer holds Q's tiles), the CPU, a config whose
    # ring leaves no room for the rotation's blocks (hd256, 4 stages: the prologue quantizes Q)
    assert not F.q_in_kernel([launch(out, True, q16=q16.half(), rot=rot)])
    assert not F.q_in_kernel([launch(out, None, q16=q16, rot=rot)])
    deep = F.Fp8Config(128, 64, 4, 4, consumers=2)
    assert F.check_fp8(wide, deep) is None and not F.ws_quant_q(wide, deep, q16, q16, rot)
    assert F.ws_quant_q(wide, F.WS_FP8_DEFAULT_WIDE, q16, q16, rot)
    # the prologue then leaves Q out: K's and V's programs only
    both = F.prologue_launch(mod, spec, q16, k.bfloat16(), v.bfloat16(), bufs, rot)
    kv = F.prologue_launch(mod, spec, q16, k.bfloat16(), v.bfloat16(), bufs, rot, quant_q=False)
    assert kv.values["progs_q"] == 0 and both.values["progs_q"] == math.ceil(S / 128) * B * 2 * hkv
    assert kv.grid == both.grid - both.values["progs_q"] and kv.values["progs_k"] == both.values["progs_k"]
    assert ws.descriptors["desc_v"][0] == "Vt" and ws.descriptors["desc_v"][3] == [1, 1, D, 128]
    assert ws.values["KV_STAGES"] == cfg.num_stages and ws.values["CONSUMERS"] == 2
    cpu = launch(out, None)  # a CPU tensor: Triton's interpreter runs no Gluon
    assert cpu.fn.__name__ == "_attn_fwd_fp8" and cpu.values["BLOCK_M"] == F.triton_fp8_config(spec, "cpu").block_m
    odd = torch.empty(B, 2 * hkv, S, D + 1, dtype=torch.bfloat16)[..., :D]  # rows of 258 bytes
    slow = launch(odd, True)  # (the fallback config follows the tensors' device: the CPU's here)
    assert slow.fn.__name__ == "_attn_fwd_fp8" and slow.values["BLOCK_M"] == F.triton_fp8_config(spec, "cpu").block_m
    # the prologue writes V^T in the Gluon kernel's key order exactly when that kernel runs
    assert F.key_order16(mod, [ws]) and not F.key_order16(mod, [cpu]) and not F.key_order16(mod, [slow])


def test_fp8_launches_use_programmatic_dependent_launch_on_sm90_only():
    """fwd_fp8.pdl decides: CPU tensors (Triton's interpreter) get no PDL launch and PDL=False in
    every kernel (the interpreter runs no inline assembly); asked for it (an sm90 GPU), the
    prologue's kernels carry PDL=True without the launch attribute (they let the next launch
    start) and the attention launch carries both (Triton's launch_pdl option)."""
    import math

    import torch

    from attngen.families import fwd_fp8 as F
    from attngen.kernels.common import MaskArgs
    from attngen.runtime import loader
    from attngen.spec import KernelSpec

    spec = KernelSpec("fwd_fp8", "fp8_e4m3", "sm90", 128, 128, 1, "causal")
    mod = loader.load(spec)
    q = k = v = torch.empty(1, 2, 256, 128, dtype=torch.bfloat16)
    assert not F.pdl(q)
    bufs = F.alloc(F.buffers(spec, q, k, v, False), "cpu")
    rot = F.rotation(128, 0, q.dtype, "cpu")
    margs = MaskArgs(1 / math.sqrt(128), 0.0, -1, 0, False)
    lse = torch.empty(1, 2, 256)
    for use, gluon in ((None, None), (True, True), (True, None)):
        pro = F.prologue_launch(mod, spec, q, k, v, bufs, rot, use_pdl=use)
        (attn,) = F.fp8_launches(mod, spec, bufs["Q8"], bufs["K8"], bufs["Vt"], bufs["QScale"], bufs["KScale"],
                                 bufs["VScale"], torch.empty_like(q), lse, margs, F.WS_FP8_DEFAULT, gluon=gluon,
                                 use_pdl=use)
        on = bool(use)
        assert attn.fn.__name__ == ("_attn_fwd_fp8_ws" if gluon else "_attn_fwd_fp8")
        assert pro.values["PDL"] is on and not pro.pdl and "launch_pdl" not in pro.options
        assert attn.values["PDL"] is on and attn.pdl is on and attn.options.get("launch_pdl", False) is on
        assert F.copy_v_launch(mod, v.to(torch.float8_e4m3fn), bufs["Vt"], False, use_pdl=use).values["PDL"] is on
