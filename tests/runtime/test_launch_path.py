"""The runtime launch path: plan cache hits skip validation, torch.compile(fullgraph=True) through
the attngen:: custom ops (forward and backward, aot_eager on CPU), any head dim 8..256, 1-D grids
within CUDA's limits, 64-bit offsets only when needed, unspecialized length ints, explain()."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest
import torch

import attngen
from attngen.families import bwd as kbwd
from attngen.families import fwd as kfwd
from attngen.kernels.launch import MAX_GRID, needs_int64, programs
from attngen.runtime import api, loader
from attngen.runtime import validate
from attngen.runtime import plan as plan_mod
from attngen.spec import KernelSpec
from attngen.problem import Problem, attention_ref, random_inputs
from attngen.testing import assert_flash_rule, check_grads
from attngen.configs import FwdConfig

ROOT = Path(__file__).resolve().parents[2]


def inputs(b=2, hq=4, hkv=2, sq=33, sk=47, d=64, dtype=torch.float16, seed=0, layout="bhsd"):
    shapes = [(b, hq, sq, d), (b, hkv, sk, d), (b, hkv, sk, d)]
    if layout == "bshd":
        shapes = [(s[0], s[2], s[1], s[3]) for s in shapes]
    return random_inputs(*shapes, dtype=dtype, seed=seed)


def test_plan_cache_hit_skips_validation(monkeypatch):
    q, k, v = inputs(sq=21, sk=21)
    first = attngen.attention(q, k, v, causal=True)
    calls = []
    monkeypatch.setattr(validate, "check_dense", lambda *a: calls.append(a))
    again = attngen.attention(q, k, v, causal=True)
    assert calls == [], "a warm call validated again"
    assert torch.equal(first, again)
    attngen.attention(q, k, v, causal=False)  # another option: a miss, validated
    assert len(calls) == 1


@pytest.mark.parametrize("moved", ["k", "v"])
def test_warm_call_still_checks_every_tensors_device(moved):
    """The warm-call key holds each tensor's device: a k or v on another device after a warm call
    is the cold call's clear error, not a launch with a foreign pointer."""
    q, k, v = inputs(sq=23, sk=23)
    attngen.attention(q, k, v, causal=True)
    attngen.attention(q, k, v, causal=True)  # warm
    args = {"q": q, "k": k, "v": v}
    args[moved] = args[moved].to("meta")
    with pytest.raises(ValueError, match=rf"^{moved}: on meta, but q is on cpu"):
        attngen.attention(args["q"], args["k"], args["v"], causal=True)


def test_plan_cache_new_length_same_bucket_reuses_kernel_and_config():
    q, k, v = inputs(sq=40, sk=40)
    attngen.attention(q, k, v, causal=True)
    q2, k2, v2 = inputs(sq=41, sk=41)
    attngen.attention(q2, k2, v2, causal=True)
    p1 = api.forward_plan(q, k, v, validate.make_options(64, True, (-1, -1), 0.0, None, "bottom_right", "bhsd"))
    p2 = api.forward_plan(q2, k2, v2, validate.make_options(64, True, (-1, -1), 0.0, None, "bottom_right", "bhsd"))
    assert p1 is not p2 and p1.module is p2.module and p1.config == p2.config and p1.bucket == p2.bucket


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_torch_compile_fullgraph_forward_backward(layout):
    q, k, v = inputs(sq=19, sk=27, layout=layout, seed=3)
    dout, = random_inputs(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, seed=4)

    def fn(q, k, v):
        return attngen.attention(q, k, v, causal=True, layout=layout)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = compiled(*leaves)
    grads = torch.autograd.grad(out, leaves, dout)
    leaves_e = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out_e = fn(*leaves_e)
    grads_e = torch.autograd.grad(out_e, leaves_e, dout)
    assert torch.equal(out, out_e)
    for a, b in zip(grads, grads_e):
        assert torch.equal(a, b)


def test_torch_compile_varlen():
    lens = [5, 17, 1]
    cu = torch.tensor([0, 5, 22, 23], dtype=torch.int32)
    q, k, v, dout = random_inputs((23, 4, 32), (23, 2, 32), (23, 2, 32), (23, 4, 32), dtype=torch.float16, seed=5)

    def fn(q, k, v):
        return attngen.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = compiled(*leaves)
    grads = torch.autograd.grad(out, leaves, dout)
    leaves_e = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out_e = fn(*leaves_e)
    assert torch.equal(out, out_e)
    for a, b in zip(grads, torch.autograd.grad(out_e, leaves_e, dout)):
        assert torch.equal(a, b)


def test_eager_varlen_gradient_skips_the_custom_op(monkeypatch):
    """Eager calls that want a gradient take the autograd Function (the custom op's dispatch cost
    more host time than a short call's kernels on the H200), still checking cu_seqlens' values."""
    from attngen.runtime import ops

    def refuse(*args):
        raise AssertionError("eager attention_varlen dispatched the custom op")

    monkeypatch.setattr(ops, "attention_fwd", refuse)
    cu = torch.tensor([0, 5, 22, 23], dtype=torch.int32)
    q, k, v, dout = random_inputs((23, 4, 32), (23, 2, 32), (23, 2, 32), (23, 4, 32), dtype=torch.float16, seed=6)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = attngen.attention_varlen(*leaves, cu, cu, 17, 17, causal=True)
    dq, dk, dv = torch.autograd.grad(out, leaves, dout)
    ref = attngen.attention_varlen(q, k, v, cu, cu, 17, 17, causal=True)  # no gradient: forward only
    assert torch.equal(out, ref) and all(torch.isfinite(g).all() for g in (dq, dk, dv))
    bad = torch.tensor([0, 5, 3, 23], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q: must be non-decreasing"):
        attngen.attention_varlen(*leaves, bad, bad, 17, 17, causal=True)


@pytest.mark.parametrize("d,dtype", [(59, torch.float16), (111, torch.bfloat16), (8, torch.float16),
                                     (200, torch.float16)])
def test_any_head_dim_forward_backward(d, dtype, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    q, k, v = inputs(b=1, hq=2, hkv=1, sq=37, sk=45, d=d, dtype=dtype, seed=d)
    dout, = random_inputs(q.shape, dtype=dtype, seed=d + 1)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = attngen.attention(*leaves, causal=True)
    grads = torch.autograd.grad(out, leaves, dout)
    ref, _ = attention_ref(q, k, v, causal=True)
    pt, _ = attention_ref(q, k, v, causal=True, upcast=False)
    assert_flash_rule(f"hd{d}/out", out, ref, pt, 2.0)
    check_grads(f"hd{d}", lambda *t, upcast: attention_ref(*t, causal=True, upcast=upcast)[0],
                (q, k, v), dout, grads)


def test_grid_is_one_axis_within_cuda_limits():
    """B * H = 131072 > 65535 (CUDA's cap on the 2nd/3rd axes): one axis of blocks x batch x heads."""
    spec = KernelSpec("fwd", "fp16", "sm80", 64, 64, 4, "causal")
    mod = loader.load(spec)
    B, Hq, Hkv, S = 4096, 32, 8, 16
    e = lambda *s: torch.empty(1, dtype=torch.float16).expand(*s)  # noqa: E731  (no memory)
    q, k, out = e(B, Hq, S, 64), e(B, Hkv, S, 64), e(B, Hq, S, 64)
    lse = torch.empty(1).expand(B, Hq, S)
    mask = validate.make_options(64, True, (-1, -1), 0.0, None, "bottom_right", "bhsd").mask_args
    (launch,) = kfwd.fwd_launches(mod, spec, q, k, k, out, lse, mask, FwdConfig(64, 64, 4, 1))
    assert launch.grid == B * Hq * 1 and launch.values["num_m_blocks"] == 1
    with pytest.raises(ValueError, match="above CUDA's grid limit"):
        programs(MAX_GRID, 2, "q")


def test_many_heads_decode_on_one_axis():
    """A grid of 3 blocks x 130 (batch x heads) programs maps back to the right rows (interpreter)."""
    q, k, v = inputs(b=13, hq=10, hkv=5, sq=70, sk=70, d=16, seed=9)
    out = attngen.attention(q, k, v, causal=True)
    ref, _ = attention_ref(q, k, v, causal=True)
    pt, _ = attention_ref(q, k, v, causal=True, upcast=False)
    assert_flash_rule("many heads", out, ref, pt, 2.0)


def test_needs_int64_only_past_2_31():
    assert not needs_int64(torch.empty((1 << 31) - 1, device="meta"))
    assert needs_int64(torch.empty(1 << 31, device="meta"))
    # a strided view: its span, not its numel, decides
    big = torch.empty(3, (1 << 30) + 8, device="meta")
    assert needs_int64(big[:, :8]) and big[:, :8].numel() == 24


def test_64bit_offsets_compute_the_same(monkeypatch):
    """OFFS_64 forced on: the 64-bit offset code paths (forward and backward) give the same bits."""
    q, k, v = inputs(b=1, hq=2, hkv=1, sq=40, sk=50, d=32, seed=11)
    dout, = random_inputs(q.shape, dtype=q.dtype, seed=12)
    runs = []
    for wide in (False, True):
        monkeypatch.setattr(kfwd, "needs_int64", lambda *t, w=wide: w)
        monkeypatch.setattr(kbwd, "needs_int64", lambda *t, w=wide: w)
        api.clear_plans()
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = attngen.attention(*leaves, causal=True, window_size=(9, 3))
        runs.append([out, *torch.autograd.grad(out, leaves, dout)])
        assert api._FWD and all(p.launches_spec[0].values["OFFS_64"] == wide for p in api._FWD.values())
    api.clear_plans()
    for a, b in zip(*runs):
        assert torch.equal(a, b)


# Int parameters that follow sequence lengths (LSE / delta strides follow Sq or the packed length)
LENGTH_INTS = ("seqlen_q", "seqlen_k", "num_m_blocks", "num_n_blocks", "num_items", "diag_offset", "window_left",
               "window_right", "stride_lz", "stride_lh", "stride_lm")


def test_length_ints_are_not_specialized():
    """Every generated kernel passes sequence lengths, block counts, mask offsets and LSE strides
    unspecialized (Triton would compile again when one of them changes divisibility), and its
    batch / head / sequence strides too when a head dim is not a multiple of 16. Each entry point's
    exported ABI names its parameters in the signature's order, and its do_not_specialize list is
    what its roles say."""
    manifest = json.loads((ROOT / "generated" / "manifest.json").read_text())["kernels"]
    checked = 0
    for ent in manifest.values():
        src = (ROOT / "generated" / ent["file"]).read_text()
        tree = ast.parse(src)
        # ABI["<entry point>"] = ((parameter, role), ...) records; VARIANTS = tuple(ABI)
        abi = {n.targets[0].slice.value: ast.literal_eval(n.value) for n in tree.body
               if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Subscript)
               and ast.unparse(n.targets[0].value) == "ABI"}
        assert "VARIANTS = tuple(ABI)" in src, ent["file"]
        variants = tuple(abi)
        spec = ent["kernel_spec"]
        follow = spec["head_dim_qk"] % 16 or spec["head_dim_v"] % 16
        fns = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert variants == tuple(abi) and set(variants) <= set(fns), ent["file"]
        for name in variants:
            fn = fns[name]
            params = [a.arg for a in fn.args.args]
            assert [n for n, _ in abi[name]] == params, (ent["file"], name)
            (dec,) = [d for d in fn.decorator_list if isinstance(d, ast.Call)]
            dns = {ast.literal_eval(x) for kw in dec.keywords if kw.arg == "do_not_specialize" for x in kw.value.elts}
            assert set(params) & set(LENGTH_INTS) <= dns, (ent["file"], name, set(params) & set(LENGTH_INTS) - dns)
            assert dns == {n for n, role in abi[name] if role == "length" or (role == "stride" and follow)}
            if follow:
                assert {n for n in params if n.startswith("stride_") and n[-1] in "zhmn"} <= dns, (ent["file"], name)
            checked += 1
    assert checked >= len(manifest)


def test_explain_names_kernel_config_bucket():
    q, k, v = inputs(sq=300, sk=300)
    info = attngen.explain(q, k, v, causal=True)
    assert info["kernel"] == "attn_fwd_fp16_hd64_gqa2_causal_sm80"
    assert info["bucket"] == "q512_k512_bh8" and info["config_source"] == "default"
    assert Path(info["file"]).is_file() and set(info["config"]) >= {"block_m", "block_n"}
    assert info["backward"]["kernel"] == "attn_bwd_fp16_hd64_gqa2_causal_sm80"
    assert info["offsets_64bit"] is False
    (launch,) = info["launches"]
    assert launch["entry"] == "_attn_fwd" and launch["programs"] == info["programs"] > 0
    assert (launch["block_m"], launch["block_n"]) == (info["config"]["block_m"], info["config"]["block_n"])


def test_explain_packed_documents():
    q, k, v = random_inputs((50, 4, 64), (50, 2, 64), (50, 2, 64), dtype=torch.float16, seed=5)
    cu = torch.tensor([0, 20, 50], dtype=torch.int32)
    info = attngen.explain(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=30,
                           max_seqlen_k=30)
    assert info["kernel"] == "attn_fwd_fp16_hd64_gqa2_doc_causal_sm80" and info["layout"] == "packed"
    assert info["backward"]["kernel"] == "attn_bwd_fp16_hd64_gqa2_doc_causal_sm80"
    assert info["bucket"] == "q32_k32_bh8"
    with pytest.raises(ValueError, match="max_seqlen_q: 10 is below the longest document"):
        attngen.explain(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=10, max_seqlen_k=30)


def test_explain_reports_the_config_a_host_bound_call_runs(monkeypatch):
    """An sm90 warp-specialized config on a host-bound shape runs the Triton pointer kernel with
    that kernel's own tiles: the plan's config and explain() say so, not the table's choice."""
    from attngen.runtime import dispatch
    from attngen.configs import WS_DEFAULT, triton_fallback

    monkeypatch.setattr(dispatch, "device_target", lambda device: "sm90")
    monkeypatch.setattr(dispatch, "select_config", lambda spec, h, dc, b, w=None: (
        (WS_DEFAULT, "test") if spec.family == "fwd" else (dispatch.family("bwd").default(spec, "cpu"), "test")))
    api.clear_plans()
    try:
        q, k, v = inputs(b=1, hq=4, hkv=1, sq=64, sk=64, d=128)
        info = attngen.explain(q, k, v, causal=True)
    finally:
        api.clear_plans()
    runs = triton_fallback(WS_DEFAULT, KernelSpec("fwd", "fp16", "sm90", 128, 128, 4, "causal"))
    assert info["config"]["consumers"] == 0 and info["config"]["tma"] is False
    assert (info["config"]["block_m"], info["config"]["block_n"]) == (runs.block_m, runs.block_n)
    assert "host-bound" in info["config_source"]
    (launch,) = info["launches"]
    assert launch["entry"] == "_attn_fwd" and launch["block_m"] == runs.block_m


def test_warmup_runs_each_bucket():
    rows = attngen.warmup(num_q_heads=2, num_kv_heads=1, head_dim=16, seqlens=(20, 70),
                          dtype=torch.float16, device="cpu", causal=True, backward=True)
    assert [r["bucket"] for r in rows] == ["q32_k32_bh2", "q128_k128_bh2"]


def test_sm90_tma_kernel_chosen_only_when_the_copy_engine_can_serve():
    """The sm90 family's TMA kernel runs for aligned views; a misaligned base gets the pointer
    kernel; both compute the same attention."""
    spec = KernelSpec("fwd", "fp16", "sm90", 64, 64, 2, "causal")
    mod = loader.load(spec)
    mask = validate.make_options(64, True, (-1, -1), 0.0, None, "bottom_right", "bhsd").mask_args
    cfg = FwdConfig(32, 32, 4, 1, tma=True)
    q, k, v = inputs(b=1, hq=4, hkv=2, sq=45, sk=45, seed=21)
    outs = []
    for shift in (0, 1):
        buf = torch.empty(q.numel() + 8, dtype=q.dtype)
        qs = buf[shift:shift + q.numel()].view(q.shape).copy_(q)  # shift 1: base off by 2 bytes
        out, lse = torch.empty_like(q), torch.empty(q.shape[:3])
        (launch,) = kfwd.fwd_launches(mod, spec, qs, k, v, out, lse, mask, cfg)
        assert launch.fn.__name__ == ("_attn_fwd_tma" if shift == 0 else "_attn_fwd")
        launch.run()
        outs.append(out)
    ref, _ = attention_ref(q, k, v, causal=True)
    pt, _ = attention_ref(q, k, v, causal=True, upcast=False)
    for out in outs:
        assert_flash_rule("sm90", out, ref, pt, 2.0)


def assert_pointer_fallback(bplan, grads, odd_grads):
    """A misaligned call under the same backward key went through the plan's pointer-kernel
    fallback and got the same gradients as the TMA kernels."""
    assert len(api._BWD) == 1 and bplan._portable is not None  # same key, pointer kernels
    assert [la.fn.__name__ for la in bplan._portable.launches] == [
        "_attn_bwd_preprocess", "_attn_bwd_dkdv", "_attn_bwd_dq"]
    for g, g_odd in zip(grads, odd_grads):
        torch.testing.assert_close(g_odd, g, atol=2e-3, rtol=0)


def test_runtime_plans_the_sm90_tma_kernel(monkeypatch):
    """The runtime's plan path with the sm90 family's TMA configs (forward and backward):
    descriptors rebuilt around each call's tensors, a misaligned call served by the pointer
    kernels, gradients through the same plans."""
    import dataclasses

    from attngen.runtime import dispatch

    monkeypatch.setattr(dispatch, "device_target", lambda device: "sm90")
    monkeypatch.setattr(dispatch, "select_config", lambda spec, h, dc, b, w=None: (
        (FwdConfig(32, 32, 4, 1, tma=True), "test") if spec.family == "fwd"
        else (dataclasses.replace(dispatch.family("bwd").default(spec, "cpu"), tma=True), "test")))
    monkeypatch.setattr(plan_mod, "HOST_BOUND_WORK", 0)  # small shapes would take the pointer kernel
    api.clear_plans()
    try:
        q, k, v = inputs(b=1, hq=4, hkv=2, sq=45, sk=45, seed=31, layout="bshd")
        dout, = random_inputs(q.shape, dtype=q.dtype, seed=32)
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = attngen.attention(*leaves, causal=True, layout="bshd")
        grads = torch.autograd.grad(out, leaves, dout)
        plan = next(iter(api._FWD.values()))
        assert plan.spec.target == "sm90" and plan.launches_spec[0].fn.__name__ == "_attn_fwd_tma"
        again = attngen.attention(q, k, v, causal=True, layout="bshd")  # a warm call: new descriptors
        assert all(la.descs.fast for la in plan.launches if la.descs), "the warm call rebuilt descriptors through Triton"
        buf = torch.empty(q.numel() + 8, dtype=q.dtype)
        q_odd = buf[1:1 + q.numel()].view(q.shape).copy_(q)  # 2-byte offset: no TMA
        odd = attngen.attention(q_odd, k, v, causal=True, layout="bshd")
        assert torch.equal(out.detach(), again) and torch.equal(again, odd)
        bhsd = lambda t: t.transpose(1, 2)  # noqa: E731
        ref, _ = attention_ref(bhsd(q), bhsd(k), bhsd(v), causal=True)
        pt, _ = attention_ref(bhsd(q), bhsd(k), bhsd(v), causal=True, upcast=False)
        assert_flash_rule("sm90 plan", bhsd(out), ref, pt, 2.0)
        check_grads("sm90 plan", lambda *t, upcast: attention_ref(*(bhsd(x) for x in t), causal=True,
                                                                  upcast=upcast)[0].transpose(1, 2),
                    (q, k, v), dout, grads)
        bplan = next(iter(api._BWD.values()))
        assert [la.fn.__name__ for la in bplan.launches] == [
            "_attn_bwd_preprocess", "_attn_bwd_dkdv_tma", "_attn_bwd_dq_tma"]
        odd_leaves = [q_odd.requires_grad_(True)] + [t.clone().requires_grad_(True) for t in (k, v)]
        odd_grads = torch.autograd.grad(attngen.attention(*odd_leaves, causal=True, layout="bshd"),
                                        odd_leaves, dout)
        assert_pointer_fallback(bplan, grads, odd_grads)
    finally:
        api.clear_plans()


def test_runtime_plans_the_sm90_tma_kernels_for_packed_documents(monkeypatch):
    """attention_varlen through the runtime's plans with the sm90 TMA configs: descriptors over
    the packed tensors rebuilt per call (a warm call with other values), a misaligned call served
    by the pointer kernels under the same key, gradients through the same plans."""
    import dataclasses

    from attngen.runtime import dispatch

    monkeypatch.setattr(dispatch, "device_target", lambda device: "sm90")
    monkeypatch.setattr(dispatch, "select_config", lambda spec, h, dc, b, w=None: (
        (FwdConfig(32, 32, 4, 1, tma=True), "test") if spec.family == "fwd"
        else (dataclasses.replace(dispatch.family("bwd").default(spec, "cpu"), tma=True), "test")))
    monkeypatch.setattr(plan_mod, "HOST_BOUND_WORK", 0)
    api.clear_plans()
    lens = [7, 40, 1, 33]
    T = sum(lens)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    try:
        q, k, v, dout = random_inputs((T, 4, 64), (T, 2, 64), (T, 2, 64), (T, 4, 64), dtype=torch.float16, seed=51)
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = attngen.attention_varlen(*leaves, cu, cu, max(lens), max(lens), causal=True)
        grads = torch.autograd.grad(out, leaves, dout)
        plan = next(iter(api._FWD.values()))
        assert plan.launches_spec[0].fn.__name__ == "_attn_fwd_tma"
        bplan = next(iter(api._BWD.values()))
        assert [la.fn.__name__ for la in bplan.launches] == [
            "_attn_bwd_preprocess", "_attn_bwd_dkdv_tma", "_attn_bwd_dq_tma"]
        q2 = torch.randn_like(q)
        warm = attngen.attention_varlen(q2, k, v, cu, cu, max(lens), max(lens), causal=True)
        buf = torch.empty(q.numel() + 8, dtype=q.dtype)
        q_odd = buf[1:1 + q.numel()].view(q.shape).copy_(q)  # 2-byte offset: no TMA
        odd = attngen.attention_varlen(q_odd, k, v, cu, cu, max(lens), max(lens), causal=True)
        assert torch.equal(out.detach(), odd) and len(api._FWD) == 1 and plan._portable is not None
        docs = Problem.packed_documents(lens, lens, heads_q=4, heads_kv=2, head_dim_qk=64, head_dim_v=64,
                                        dtype="fp16", causal=True)
        for query, got in ((q, out), (q2, warm)):
            ref, _ = docs.reference(query, k, v)
            torch.testing.assert_close(got.detach().double(), ref, atol=2e-3, rtol=0)
        odd_leaves = [q_odd.requires_grad_(True)] + [t.clone().requires_grad_(True) for t in (k, v)]
        odd_grads = torch.autograd.grad(attngen.attention_varlen(*odd_leaves, cu, cu, max(lens), max(lens),
                                                                 causal=True), odd_leaves, dout)
        assert_pointer_fallback(bplan, grads, odd_grads)
    finally:
        api.clear_plans()


def test_host_bound_shapes_skip_the_descriptors(monkeypatch):
    """A tiny call on the sm90 family takes the pointer kernel even when its config says TMA."""
    from attngen.runtime import dispatch

    monkeypatch.setattr(dispatch, "device_target", lambda device: "sm90")
    monkeypatch.setattr(dispatch, "select_config", lambda spec, h, dc, b, w=None: (
        (FwdConfig(32, 32, 4, 1, tma=True), "test") if spec.family == "fwd"
        else (dispatch.family("bwd").default(spec, "cpu"), "test")))
    api.clear_plans()
    try:
        for s, name in ((64, "_attn_fwd"), (2048, "_attn_fwd_tma")):
            q, k, v = (torch.empty(1, 2 if s == 64 else 8, s, 32, dtype=torch.float16) for _ in range(3))
            info = attngen.explain(q, k, v, causal=True)
            plan = api.forward_plan(q, k, v, validate.make_options(32, True, (-1, -1), 0.0, None, "bottom_right", "bhsd"))
            assert plan.launches_spec[0].fn.__name__ == name, (s, info)
    finally:
        api.clear_plans()


def test_lse_scratch_does_not_leak_into_returned_lse():
    """Calls without return_lse write the LSE into a per-plan scratch buffer; calls that ask for
    it get a fresh tensor every time, with the right values."""
    q, k, v = inputs(sq=30, sk=30, seed=41)
    out1 = attngen.attention(q, k, v, causal=True)
    out2, lse2 = attngen.attention(q, k, v, causal=True, return_lse=True)
    _, lse3 = attngen.attention(q, k, v, causal=True, return_lse=True)
    q2, k2, v2 = inputs(sq=30, sk=30, seed=42)
    attngen.attention(q2, k2, v2, causal=True)  # reuses the scratch: must not touch lse2
    assert torch.equal(out1, out2) and lse2.data_ptr() != lse3.data_ptr()
    _, ref_lse = attention_ref(q, k, v, causal=True)
    torch.testing.assert_close(lse2.double(), ref_lse, atol=1e-4, rtol=1e-4)


def test_window_backward_default_follows_the_call_window():
    """The sliding-window backward's default tiles depend on the window the call asks for (short
    windows take 32-query dK/dV steps, long or unknown ones the 64-query default; the Gluon head
    dims take the Gluon passes whatever the window), and the runtime passes the call's window through
    Options.window."""
    from attngen.runtime import dispatch
    from attngen.buckets import bucket_of

    spec = KernelSpec("bwd", "fp16", "sm90", 112, 112, 4, "sliding_window")  # not in the shipped DB, not Gluon
    bucket = bucket_of(8192, 8192, 32)
    picks = {w: dispatch.select_config(spec, "0" * 16, "h100", bucket, w) for w in (1025, 4097, None)}
    assert all(src == "default" for _, src in picks.values())
    assert [picks[w][0].block_m for w in (1025, 4097, None)] == [32, 64, 64]
    opts = validate.make_options(128, True, (1024, 0), 0.0, None, "bottom_right", "bhsd")
    assert opts.window == 1025
    assert validate.make_options(128, False, (9, 4), 0.0, None, "bottom_right", "bhsd").window == 14
    assert validate.make_options(128, True, (-1, -1), 0.0, None, "bottom_right", "bhsd").window is None


@pytest.mark.parametrize("hd", [64, 128])
def test_kernel_descriptors_off_keeps_packed_documents_off_kernel_made_descriptors(monkeypatch, hd):
    """ATTNGEN_KERNEL_DESCRIPTORS=0: a packed-documents backward leaves the Gluon passes (whose
    launches make TMA descriptors in the kernel: Launch.scratch) for the Triton TMA passes' default
    tiles, tuned or default config alike; dense calls keep the Gluon passes (host descriptors), and
    the paged prefill leaves the copy engine for the pointer gather. Unset, nothing changes."""
    import torch

    from attngen.buckets import bucket_of
    from attngen.configs import check_bwd, default_bwd_config
    from attngen.db import winners
    from attngen.families.bwd import bwd_launches
    from attngen.families.prefill_paged import check_prefill_paged
    from attngen.kernels.common import MaskArgs
    from attngen.problem import random_inputs
    from attngen.runtime import dispatch, loader

    packed = KernelSpec("bwd", "bf16", "sm90", hd, hd, 4, "causal", varlen=True)
    dense = packed.replace(varlen=False)
    paged = KernelSpec("prefill_paged", "bf16", "sm90", 128, 128, 1, "causal")  # one head a tile: tma
    bucket = bucket_of(4096, 4096, 32)

    def pick(spec):
        return dispatch.select_config(spec, "0" * 16, "h100", bucket)

    monkeypatch.setattr(winners, "lookup", lambda *a, **k: None)
    gluon, paged_on = pick(packed)[0], pick(paged)[0]
    assert gluon.consumers == 2 and gluon == default_bwd_config(packed, "cuda") and paged_on.tma
    assert pick(dense)[0] == default_bwd_config(dense, "cuda")
    monkeypatch.setenv("ATTNGEN_KERNEL_DESCRIPTORS", "0")
    host, source = pick(packed)
    assert source == "default" and host.consumers == 0 and host.dq_consumers == 0 and host.tma
    assert (host.block_m, host.block_n) == (64, 64) and check_bwd(packed, host) is None
    assert pick(dense)[0] == default_bwd_config(dense, "cuda")  # dense: host descriptors already
    off, _ = pick(paged)
    assert not off.tma and check_prefill_paged(paged, off) is None
    # a tuned Gluon winner goes the same way
    monkeypatch.setattr(winners, "lookup", lambda *a, **k: dataclasses.asdict(gluon))
    tuned, source = pick(packed)
    assert source == "tuned" and tuned == host

    # the launches: the Gluon config's dK/dV pass asks for kernel scratch (descriptors made per
    # document), the host config's launches do not
    lens = [200, 77, 300]
    t = sum(lens)
    q, k, v, dout = random_inputs((t, 8, hd), (t, 2, hd), (t, 2, hd), (t, 8, hd), dtype=torch.bfloat16)
    lse = torch.empty(8, t)
    bufs = (torch.empty_like(q), dout, lse, torch.empty_like(lse), torch.empty_like(q), torch.empty_like(k),
            torch.empty_like(v))
    cu = torch.tensor([0, 200, 277, 577], dtype=torch.int32)
    args = MaskArgs(scale=0.1, softcap=0.0, window_left=-1, window_right=0, align_top_left=False)
    mod = loader.load(packed)
    with_gluon = bwd_launches(mod, packed, q, k, v, *bufs, args, gluon, False, cu, cu, 300, 300, gluon=True)
    by_name = {la.fn.__name__: la for la in with_gluon}
    assert by_name["_attn_bwd_dkdv_ws"].scratch and sorted(by_name["_attn_bwd_dkdv_ws"].descriptors) == ["desc_k", "desc_v"]
    if gluon.dq_consumers:  # hd128: the Gluon dQ pass makes K / V per document, takes Q and dO from the host
        assert by_name["_attn_bwd_dq_ws"].scratch and sorted(by_name["_attn_bwd_dq_ws"].descriptors) == ["desc_do", "desc_q"]
    without = bwd_launches(mod, packed, q, k, v, *bufs, args, host, False, cu, cu, 300, 300, gluon=True)
    assert not any(la.scratch for la in without), [la.fn.__name__ for la in without]
