"""The prefill_paged family in Triton's interpreter: chunked prefill on a paged KV cache against a
float64 reference by flash-attn's 2x rule. Ragged chunks (1, 17, 113 queries, a chunk longer than
its keys) against 30..203 keys, pages of 16 and 32 in shuffled order with spare pages and -1
padding past the pages a sequence uses (seqused_k below the table's capacity), GQA packed and not
(ratios 1, 2, 3, 4), causal / no mask / windows / softcap / top-left alignment, key counts from
seqused_k or cu_seqlens_k, tiles of 16 to 64 rows and 16 to 64 keys. Outputs are poisoned with NaN
first, so a row the kernel fails to write is caught. Then the public call (attention_varlen with
block_table) against attention_varlen on the same keys packed densely, its argument errors, the
custom op under torch.compile, and the tuner's hooks. Metadata out of range:
test_prefill_paged_guard.py; the same grid on a GPU: tests/gpu/test_gpu_prefill_paged.py."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

import attngen
from attngen.families import prefill_paged as fp
from attngen.kernels.common import MaskArgs, mask_kind
from attngen.problem import attention_ref, random_inputs
from attngen.runtime import loader
from attngen.spec import KernelSpec
from attngen.testing import assert_flash_rule, assert_lse_close

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def cumulative(lens, device="cpu") -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=device)


def make_paged(lens_k, hkv, d, dtype, page, seed, device="cpu", spare=3, room=1, pad=-1):
    """(k_pages, v_pages, table): each sequence's keys in ceil(len / page) pages of a shuffled pool
    (plus `spare` pages nobody uses, holding random values too), the table `room` entries wider
    than the longest sequence needs, `pad` past the pages a sequence uses (its capacity then
    exceeds its keys)."""
    used = [-(-n // page) for n in lens_k]
    total = sum(used) + spare
    k, v = random_inputs((total, page, hkv, d), (total, page, hkv, d), dtype=dtype, device=device, seed=seed)
    order = torch.randperm(total, generator=torch.Generator().manual_seed(seed)).tolist()
    table = torch.full((len(lens_k), max(used) + room), pad, dtype=torch.int32)
    at = 0
    for b, n in enumerate(used):
        table[b, :n] = torch.tensor(order[at:at + n], dtype=torch.int32)
        at += n
    return k, v, table.to(device)


def dense_keys(pages, table, lens_k):
    """Each sequence's keys as the kernel should see them, packed one after the other (T_k, H, D)."""
    rows = [pages[table[b, :-(-n // pages.shape[1])].long()].reshape(-1, *pages.shape[2:])[:n]
            for b, n in enumerate(lens_k)]
    return torch.cat(rows)


def reference(q, k, v, lens_q, lens_k, causal, window, softcap, scale, top_left=False, upcast=True):
    """(out (T_q, Hq, Dv), lse (Hq, T_q)) per sequence on its dense keys (bottom-right unless top_left)."""
    outs, lses = [], []
    cq, ck = cumulative(lens_q).tolist(), cumulative(lens_k).tolist()
    for b in range(len(lens_q)):
        t = lambda x, a, z: x[a:z].transpose(0, 1)[None]  # noqa: E731 - (T, H, D) -> (1, H, T, D)
        o, lse = attention_ref(t(q, cq[b], cq[b + 1]), t(k, ck[b], ck[b + 1]), t(v, ck[b], ck[b + 1]), causal=causal,
                               window_size=window, softcap=softcap, scale=scale, top_left=top_left, upcast=upcast)
        outs.append(o[0].transpose(0, 1))
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


# (dtype, chunk lengths, key counts, Hq, Hkv, D, page, causal, window, softcap, top_left, pack_gqa,
#  block_m, block_n, key counts from seqused_k)
CASES = [
    ("fp16", [1, 17, 113], [40, 90, 203], 4, 2, 32, 16, True, (-1, -1), 0.0, False, True, 64, 64, True),
    ("bf16", [1, 17, 113], [40, 90, 203], 4, 2, 64, 32, False, (-1, -1), 0.0, False, True, 32, 32, False),
    ("fp16", [33, 113, 5], [33, 100, 160], 6, 2, 40, 16, True, (24, -1), 0.0, False, False, 64, 64, True),
    ("bf16", [64, 7], [150, 64], 4, 4, 64, 32, False, (20, 7), 0.0, False, True, 32, 32, True),
    ("fp16", [17, 50], [80, 121], 8, 2, 32, 16, True, (-1, -1), 30.0, False, True, 64, 16, False),
    ("bf16", [29, 3, 0], [61, 130, 30], 6, 2, 32, 16, True, (-1, -1), 0.0, False, True, 16, 64, True),
    ("fp16", [20, 9], [45, 30], 4, 2, 32, 32, True, (-1, -1), 0.0, True, True, 32, 32, True),
]


def _name(c):
    dt, lq, lk, hq, hkv, d, page, causal, window, softcap, top_left, pack, bm, bn, used = c
    return (f"{dt}_q{'-'.join(map(str, lq))}_k{'-'.join(map(str, lk))}_h{hq}x{hkv}_hd{d}_page{page}"
            f"{'_causal' if causal else ''}{'_w%dx%d' % window if window != (-1, -1) else ''}"
            f"{'_cap%g' % softcap if softcap else ''}{'_topleft' if top_left else ''}{'_pack' if pack else ''}"
            f"_{bm}x{bn}{'_seqused' if used else '_cuk'}")


def run_case(case, device="cpu", tma=False):
    """The family's launch on the case with NaN-poisoned outputs: (out, lse, o64, l64, o_pt).
    tma: the sm90 kernel with K / V through descriptors (the launch must take that path)."""
    dt, lq, lk, hq, hkv, d, page, causal, window, softcap, top_left, pack, bm, bn, used = case
    dtype = DTYPES[dt]
    mask, wl, wr = mask_kind(causal, window)
    spec = KernelSpec("prefill_paged", dt, "sm90" if tma else "sm80", d, d, hq // hkv, mask, softcap > 0, False)
    mod = loader.load(spec)
    kp, vp, table = make_paged(lk, hkv, d, dtype, page, seed=1, device=device)
    for b, n in enumerate(lk):  # slots of a sequence's last page past its keys: NaN, never read into a row
        if n % page:
            kp[table[b, n // page].long(), n % page:] = float("nan")
            vp[table[b, n // page].long(), n % page:] = float("nan")
    q, = random_inputs((sum(lq), hq, d), dtype=dtype, device=device, seed=2, mults=[3.0 if softcap else 1.0])
    cu_q, cu_k = cumulative(lq, device), cumulative(lk, device)
    seqused = torch.tensor(lk, dtype=torch.int32, device=device) if used else None
    out = torch.full((sum(lq), hq, d), float("nan"), dtype=dtype, device=device)
    lse = torch.full((hq, sum(lq)), float("nan"), device=device)
    scale = 1.0 / math.sqrt(d)
    cfg = fp.PrefillPagedConfig(bm, bn, 4, 1, pack_gqa=pack, tma=tma)
    flags = torch.zeros(4, dtype=torch.int32, device=device)
    for la in fp.prefill_paged_launches(mod, spec, q, kp, vp, out, lse, cu_q, None if used else cu_k, seqused, table,
                                        max(lq), MaskArgs(scale, softcap, wl, wr, top_left), cfg, flags):
        assert la.values["TMA_KV"] == tma and la.scratch == tma
        la.run()
    assert not flags.any(), f"valid metadata flagged: {flags.tolist()}"
    k, v = dense_keys(kp, table, lk), dense_keys(vp, table, lk)
    o64, l64 = reference(q, k, v, lq, lk, causal, window, softcap, scale, top_left)
    opt, _ = reference(q, k, v, lq, lk, causal, window, softcap, scale, top_left, upcast=False)
    return out, lse, o64, l64, opt


@pytest.mark.parametrize("case", CASES, ids=[_name(c) for c in CASES])
def test_prefill_paged_kernel_against_float64(case):
    out, lse, o64, l64, opt = run_case(case)
    assert_flash_rule(_name(case), out, o64, opt, 2.0)
    assert_lse_close(_name(case) + " lse", lse, l64)


# K / V through descriptors (sm90): pages of one block (32 / 32) and of two or four (64 / 32,
# 64 / 16), a head dim the descriptor pads (40), the last page of a sequence partly past its keys
# (random values there: their V rows must be zeroed), -1 padding, windows, softcap, top-left
TMA_CASES = [
    ("fp16", [1, 17, 113], [40, 90, 203], 4, 2, 32, 32, True, (-1, -1), 0.0, False, True, 64, 32, True),
    ("bf16", [33, 113, 5], [33, 100, 160], 6, 2, 40, 64, True, (24, -1), 0.0, False, False, 32, 32, False),
    ("fp16", [17, 50, 64], [80, 121, 64], 8, 2, 32, 64, False, (20, 7), 30.0, False, True, 64, 16, True),
    ("bf16", [20, 9], [45, 30], 4, 2, 64, 32, True, (-1, -1), 0.0, True, True, 32, 32, True),
]


@pytest.mark.parametrize("case", TMA_CASES, ids=[_name(c) for c in TMA_CASES])
def test_prefill_paged_tma_kernel_against_float64(case):
    out, lse, o64, l64, opt = run_case(case, tma=True)
    assert_flash_rule(_name(case) + " tma", out, o64, opt, 2.0)
    assert_lse_close(_name(case) + " tma lse", lse, l64)


def test_tma_kv_takes_only_pages_that_hold_whole_blocks():
    """tma_kv: on only where every block of keys lies in one page of a contiguous, aligned pool."""
    spec = KernelSpec("prefill_paged", "bf16", "sm90", 64, 64, 2, "causal", False, False)
    kp = torch.zeros(5, 64, 2, 64, dtype=torch.bfloat16)
    on = fp.PrefillPagedConfig(64, 64, 4, 2, tma=True)
    assert fp.tma_kv(on, kp, kp)
    assert not fp.tma_kv(fp.PrefillPagedConfig(64, 64, 4, 2), kp, kp)  # tma off
    assert not fp.tma_kv(fp.PrefillPagedConfig(64, 128, 4, 2, tma=True), kp, kp)  # a block spans two pages
    assert fp.tma_kv(fp.PrefillPagedConfig(64, 32, 4, 2, tma=True), kp, kp)
    wide = torch.zeros(5, 96, 2, 64, dtype=torch.bfloat16)[:, :64]  # pages not back to back
    assert not fp.tma_kv(on, wide, wide)
    odd = torch.zeros(5, 64, 2, 68, dtype=torch.bfloat16)[..., :60]  # rows not 16-byte aligned
    assert not fp.tma_kv(on, odd, odd)
    assert fp.check_prefill_paged(dataclasses.replace(spec, target="sm80"), on) is not None
    assert fp.check_prefill_paged(spec, on) is None


def _call_inputs(lq, lk, hq, hkv, d, page, dtype=torch.float16, seed=3):
    kp, vp, table = make_paged(lk, hkv, d, dtype, page, seed=seed)
    q, = random_inputs((sum(lq), hq, d), dtype=dtype, seed=seed + 1)
    return q, kp, vp, table, cumulative(lq), cumulative(lk), torch.tensor(lk, dtype=torch.int32)


@pytest.mark.parametrize("pack", [False, True])
def test_attention_varlen_paged_matches_dense_varlen(pack):
    """attention_varlen with block_table against attention_varlen on the same keys packed densely
    (the forward family's kernel): unpacked at the forward's tiles the two agree bit for bit,
    packed (other rows share a tile, another masked / unmasked split) within the 2x rule of each
    other's reference."""
    lq, lk, hq, hkv, d = [17, 1, 113], [60, 90, 203], 4, 2, 32
    q, kp, vp, table, cu_q, cu_k, used = _call_inputs(lq, lk, hq, hkv, d, 16)
    k, v = dense_keys(kp, table, lk), dense_keys(vp, table, lk)
    kw = dict(causal=True, window_size=(70, -1), softcap=20.0, return_lse=True)
    from attngen.runtime import dispatch

    with torch.no_grad(), dispatch.forced_config(prefill_paged=fp.PrefillPagedConfig(64, 64, 4, 1, pack_gqa=pack)):
        out, lse = attngen.attention_varlen(q, kp, vp, cu_q, None, max(lq), max(lk), block_table=table,
                                            seqused_k=used, **kw)
    ref, ref_lse = attngen.attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), **kw)
    if not pack:
        assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    o64, l64 = reference(q, k, v, lq, lk, True, (70, -1), 20.0, 1 / math.sqrt(d))
    opt, _ = reference(q, k, v, lq, lk, True, (70, -1), 20.0, 1 / math.sqrt(d), upcast=False)
    assert_flash_rule("paged", out, o64, opt, 2.0)
    assert_flash_rule("paged vs dense", out, ref.double(), opt, 2.0, 1e-3)
    assert_lse_close("paged lse", lse, l64)


def test_public_call_cu_seqlens_k_and_defaults():
    """Key counts from cu_seqlens_k (no seqused_k), the family's default config, GQA 4, no mask;
    the kernel comes from generated/ (a shipped spec's entry) or the cache, the flag stays clear."""
    lq, lk = [5, 40], [37, 64]
    q, kp, vp, table, cu_q, cu_k, _ = _call_inputs(lq, lk, 8, 2, 64, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        out = attngen.attention_varlen(q, kp, vp, cu_q, cu_k, max(lq), max(lk), block_table=table)
    k, v = dense_keys(kp, table, lk), dense_keys(vp, table, lk)
    o64, _ = reference(q, k, v, lq, lk, False, (-1, -1), 0.0, 1 / 8)
    opt, _ = reference(q, k, v, lq, lk, False, (-1, -1), 0.0, 1 / 8, upcast=False)
    assert_flash_rule("cu_seqlens_k", out, o64, opt, 2.0)
    attngen.check_kvcache()


def test_torch_compile_fullgraph_paged():
    """The custom op (attngen::attention_prefill_paged) traces as one node: compiled equals eager."""
    lq, lk = [3, 20], [19, 33]
    q, kp, vp, table, cu_q, _, used = _call_inputs(lq, lk, 4, 2, 32, 16)

    def fn(q, kp, vp, cu_q, table, used):
        return attngen.attention_varlen(q, kp, vp, cu_q, None, 20, 33, causal=True, block_table=table,
                                        seqused_k=used)

    with torch.no_grad():
        eager = fn(q, kp, vp, cu_q, table, used)
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, kp, vp, cu_q, table, used)
    assert torch.equal(eager, compiled)


def _errors():
    """(what the call changes, the error it must raise)."""
    return [
        ({"k": lambda t: t["k"].new_zeros(5, 24, 2, 32), "v": lambda t: t["v"].new_zeros(5, 24, 2, 32)},
         r"k: page size 24 \(k.shape\[1\]\) is not a multiple of 16"),
        ({"table": lambda t: t["table"].long()}, r"block_table: expected an int32"),
        ({"table": lambda t: t["table"][:1]}, r"block_table: expected shape \(2, 5\)"),
        ({"used": lambda t: t["used"][:1]}, r"seqused_k: expected shape \(2,\)"),
        ({"used": lambda t: None, "cu_k": lambda t: None}, r"cu_seqlens_k: required when seqused_k is not given"),
        ({"cu_q": lambda t: torch.tensor([0, 3, 2], dtype=torch.int32)}, r"cu_seqlens_q: must end at the packed length"),
        ({"cu_q": lambda t: torch.tensor([0, 21, 20], dtype=torch.int32)}, r"cu_seqlens_q: must be non-decreasing"),
        ({"max_q": lambda t: 10}, r"max_seqlen_q: 10 is below the longest chunk of queries \(17\)"),
        ({"table": lambda t: t["table"].repeat(1, 2)[:, ::2]}, r"block_table: its last dim must be contiguous"),
        ({"used": lambda t: t["used"].repeat(2)[::2]}, r"seqused_k: its last dim must be contiguous"),
        ({"v": lambda t: t["v"][:, :, :1]}, r"v: shape .* differs from k's"),
        ({"q": lambda t: t["q"][:, :3]}, r"q: 3 query heads is not a multiple of the 2 KV heads"),
        ({"kw": lambda t: {"variant": "gpt_oss_20b_sliding"}}, r"variant: not supported with block_table"),
        ({"kw": lambda t: {"precision": "fp8"}}, r"precision: not supported with block_table"),
    ]


@pytest.mark.parametrize("change,message", _errors(), ids=[f"{i}-{m.split(':')[0]}" for i, (_, m) in enumerate(_errors())])
def test_argument_errors_name_the_argument(change, message):
    lq, lk = [3, 17], [20, 64]
    q, kp, vp, table, cu_q, cu_k, used = _call_inputs(lq, lk, 4, 2, 32, 16)
    t = {"q": q, "k": kp, "v": vp, "table": table, "cu_q": cu_q, "cu_k": cu_k, "used": used, "max_q": 17, "kw": {}}
    for name, fn in change.items():
        t[name] = fn(t)
    with torch.no_grad(), pytest.raises(ValueError, match=message):
        attngen.attention_varlen(t["q"], t["k"], t["v"], t["cu_q"], t["cu_k"], t["max_q"], 64, block_table=t["table"],
                                 seqused_k=t["used"], **t["kw"])


def test_gradients_and_seqused_without_a_table_are_refused():
    lq, lk = [3], [20]
    q, kp, vp, table, cu_q, cu_k, used = _call_inputs(lq, lk, 2, 1, 32, 16)
    with pytest.raises(ValueError, match="block_table: attention_varlen on a paged KV cache is inference only"):
        attngen.attention_varlen(q.requires_grad_(True), kp, vp, cu_q, cu_k, 3, 20, block_table=table)
    k = dense_keys(kp, table, lk)
    with pytest.raises(ValueError, match="seqused_k: only with block_table"):
        attngen.attention_varlen(q.detach(), k, k, cu_q, cu_k, 3, 20, seqused_k=used)


def test_configs_defaults_and_space():
    """Every default passes the validity filter and lies inside the search space."""
    from attngen.families.base import search_space

    sp = search_space(fp.FAMILY, "sm90")
    for d, mask, gqa, kind, sq, target in itertools.product((64, 128, 256), ("causal", "sliding_window"), (1, 4),
                                                            ("cuda", "cpu"), (16, 4096), ("sm80", "sm90")):
        s = KernelSpec("prefill_paged", "bf16", target, d, d, gqa, mask)
        cfg = fp.default_prefill_paged_config(s, kind, sq)
        assert fp.check_prefill_paged(s, cfg) is None, (s.uri, cfg)
        assert all(getattr(cfg, n) in sp[n] for n in sp), (cfg, sp)
        # the copy engine by default only on sm90 GPUs where it measured ahead: hd128, one head a tile
        assert cfg.tma == (target == "sm90" and kind == "cuda" and d == 128 and gqa == 1), (s.uri, kind, cfg)
    s = KernelSpec("prefill_paged", "bf16", "sm80", 256, 256, 1, "causal")
    assert "shared memory" in fp.check_prefill_paged(s, fp.PrefillPagedConfig(128, 128, 8, 4))
    assert "powers of two" in fp.check_prefill_paged(s, fp.PrefillPagedConfig(48, 64, 4, 1))
    # an expression kernel takes one query head a tile: its default leaves GQA unpacked, and a
    # packed config is refused
    s = KernelSpec("prefill_paged", "bf16", "sm80", 64, 64, 4, "none", sinks=True)
    cfg = fp.default_prefill_paged_config(s, "cuda", 4096)
    assert not cfg.pack_gqa and fp.check_prefill_paged(s, cfg) is None
    s128 = KernelSpec("prefill_paged", "bf16", "sm90", 128, 128, 4, "none", sinks=True)
    assert fp.default_prefill_paged_config(s128, "cuda", 4096).tma  # one head a tile: the copy engine
    assert "one query head a tile" in fp.check_prefill_paged(s, fp.PrefillPagedConfig(64, 64, 4, 2))


def test_tuning_objective_runs_the_paged_problem():
    """The tuner measures the family through its hooks: the bucket's problem as packed chunks on
    a cache paged by 16 (shuffled), checked against float64, TFLOP/s of the attended pairs; a
    config the filter rejects is never launched."""
    from attngen.buckets import parse_bucket
    from attngen.spec import load_spec
    from attngen.env import REPO_ROOT
    from attngen.tuning import objective as obj

    e = next(x for x in load_spec(REPO_ROOT / "specs" / "llama.yaml").entries if x.name == "llama3_8b")
    s = next(k for k in e.kernel_specs() if (k.family, k.dtype, k.target) == ("prefill_paged", "fp16", "sm90"))
    s = s.replace(head_dim_qk=32, head_dim_v=32)  # a small kernel of the same family for the interpreter
    p = obj.problem_for(e, s, parse_bucket("q16_k64_bh8"))
    o = obj.Objective(s, p, "cpu", timer=lambda step, config, problem: (step(), 2.0)[1])
    assert o.unit == "TFLOP/s"
    ok = o.run(fp.PrefillPagedConfig(16, 32, 4, 1))
    assert ok.status == "ok" and ok.tflops == pytest.approx(p.flops() / 2.0 / 1e9), ok
    assert o.run(fp.PrefillPagedConfig(24, 32, 4, 1)).status == "invalid"


@pytest.mark.parametrize("hq, hkv", [(4, 2), (3, 3)])
def test_expressions_and_sinks_on_a_paged_cache(hq, hkv):
    # a mask expression (causal, a window and sink tokens), a score expression with a per-head
    # parameter (ALiBi) and learned sinks on the paged prefill: each sequence against float64 on
    # its dense keys (the expressions' reference of tests/kernels/test_expr.py), rule 2x
    from tests.kernels.test_expr import reference as expr_reference

    lq, lk = [5, 23, 1], [40, 61, 17]
    q, kp, vp, table, cu_q, cu_k, used = _call_inputs(lq, lk, hq, hkv, 32, 16, seed=9)
    slopes, sinks = torch.linspace(0.5, 0.05, hq), torch.linspace(-1.0, 2.0, hq)
    mask_mod = lambda b, h, qi, ki: (ki <= qi) & ((qi - ki < 9) | (ki < 2))  # noqa: E731
    score_mod = lambda s, b, h, qi, ki: s - slopes[h] * (qi - ki).abs()  # noqa: E731
    with torch.no_grad():
        out = attngen.attention_varlen(q, kp, vp, cu_q, cu_k, max(lq), 64, block_table=table, seqused_k=used,
                                       mask_mod=mask_mod, score_mod=score_mod, sinks=sinks)
    k, v, ck = dense_keys(kp, table, lk), dense_keys(vp, table, lk), cumulative(lk)
    for b in range(len(lq)):
        qs, ks, vs = (x[c[b]:c[b + 1]].transpose(0, 1)[None] for x, c in ((q, cu_q), (k, ck), (v, ck)))
        ref = expr_reference(qs, ks, vs, mask_mod, score_mod, sinks)
        ref_pt = expr_reference(qs, ks, vs, mask_mod, score_mod, sinks, upcast=False)
        got = out[cu_q[b]:cu_q[b + 1]].transpose(0, 1)[None]
        assert_flash_rule(f"sequence {b}", got, ref, ref_pt, 2.0)


def test_expressions_under_torch_compile_paged():
    """Expressions as text, a parameter and sinks through the custom op: compiled equals eager
    (fullgraph), and a Python callable there is refused naming the fix."""
    lq, lk = [4, 17], [23, 40]
    q, kp, vp, table, cu_q, cu_k, used = _call_inputs(lq, lk, 4, 2, 32, 16, seed=11)
    slopes, sinks = torch.linspace(0.5, 0.05, 4), torch.linspace(-1.0, 2.0, 4)

    def fn(q, kp, vp, cu_q, table, used, slopes, sinks):
        return attngen.attention_varlen(q, kp, vp, cu_q, None, 17, 40, block_table=table, seqused_k=used,
                                        mask_mod="kv_idx <= q_idx and (q_idx - kv_idx < 9 or kv_idx < 2)",
                                        score_mod="score - s[h] * abs(q_idx - kv_idx)", params={"s": slopes},
                                        sinks=sinks)

    args = (q, kp, vp, cu_q, table, used, slopes, sinks)
    with torch.no_grad():
        eager = fn(*args)
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(*args)
    assert torch.equal(eager, compiled)
    assert not torch.equal(eager, attngen.attention_varlen(q, kp, vp, cu_q, None, 17, 40, block_table=table,
                                                            seqused_k=used, causal=True))
    with pytest.raises(Exception, match="mask_mod: inside torch.compile attngen takes expressions as text"):
        with torch.no_grad():
            torch.compile(lambda q: attngen.attention_varlen(
                q, kp, vp, cu_q, None, 17, 40, block_table=table, seqused_k=used,
                mask_mod=lambda b, h, qi, ki: ki <= qi), fullgraph=True, backend="aot_eager")(q)
