"""The decode family in Triton's interpreter against a float64 reference (flash-attn's 2x rule):
ragged cache_seqlens (1 included, lengths that are no multiple of the page size or of a split),
contiguous and paged caches (page sizes 16, 32, 48), Sq 1 to 16 with GQA packing, causal /
window / softcap / no mask, fp16 and bf16, forced and automatic split counts, new keys appended in
place and seen by the same call. Outputs and partial buffers are poisoned with NaN before each
launch, so a row or split the kernels fail to write is caught."""

from __future__ import annotations

import math

import pytest
import torch

import attngen
from attngen.families import decode as fd
from attngen.kernels.common import MaskArgs, mask_kind
from attngen.runtime import loader
from attngen.spec import KernelSpec
from attngen.problem import attention_ref, random_inputs
from attngen.testing import assert_flash_rule, assert_lse_close

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def reference(q, k_rows, v_rows, lens, causal, window, softcap, scale, upcast=True):
    """(B, Sq, Hq, Dv) and lse (B, Hq, Sq): each batch row against its first lens[b] keys, the
    queries bottom-right (query i at key position len - Sq + i)."""
    outs, lses = [], []
    for b, n in enumerate(lens):
        o, lse = attention_ref(q[b:b + 1].transpose(1, 2), k_rows[b:b + 1, :n].transpose(1, 2),
                               v_rows[b:b + 1, :n].transpose(1, 2), causal=causal, window_size=window,
                               softcap=softcap, scale=scale, upcast=upcast)
        outs.append(o.transpose(1, 2))
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def make_cache(B, cap, hkv, d, dtype, page, seed, device="cpu", spare=3):
    """(k_cache, v_cache, block_table): contiguous (B, cap, Hkv, D) caches, or paged ones of
    `page`-token pages in shuffled order plus `spare` unused pages (block_table None when
    contiguous); rows_view gives the (B, capacity, Hkv, D) view the kernel should see."""
    if not page:
        k, v = random_inputs((B, cap, hkv, d), (B, cap, hkv, d), dtype=dtype, device=device, seed=seed)
        return k, v, None
    npages = -(-cap // page)
    total = B * npages + spare
    k, v = random_inputs((total, page, hkv, d), (total, page, hkv, d), dtype=dtype, device=device, seed=seed)
    g = torch.Generator().manual_seed(seed)
    table = torch.randperm(total, generator=g)[:B * npages].reshape(B, npages).to(torch.int32).to(device)
    return k, v, table


def rows_view(cache, table, B):
    if table is None:
        return cache
    return cache[table.long()].reshape(B, -1, *cache.shape[2:])


# (dtype, B, Sq, Hq, Hkv, D, capacity, causal, window, softcap, page, num_splits)
CASES = [
    ("bf16", 3, 1, 8, 2, 64, 203, True, (-1, -1), 0.0, 0, 0),
    ("fp16", 2, 1, 4, 4, 128, 300, False, (-1, -1), 0.0, 0, 3),
    ("bf16", 2, 4, 8, 1, 128, 211, True, (-1, -1), 0.0, 16, 2),
    ("fp16", 3, 3, 6, 2, 40, 150, True, (50, -1), 0.0, 32, 4),
    ("bf16", 2, 2, 4, 2, 96, 113, False, (-1, -1), 30.0, 48, 0),
    ("fp16", 2, 16, 2, 1, 64, 239, True, (-1, -1), 0.0, 16, 1),
    ("bf16", 2, 5, 4, 2, 72, 160, False, (20, 7), 0.0, 0, 5),
]


def _name(c):
    dt, B, sq, hq, hkv, d, cap, causal, window, softcap, page, splits = c
    return (f"{dt}_b{B}_sq{sq}_h{hq}x{hkv}_hd{d}_cap{cap}{'_causal' if causal else ''}"
            f"{'_w%dx%d' % window if window != (-1, -1) else ''}{'_cap%g' % softcap if softcap else ''}"
            f"{'_page%d' % page if page else ''}_s{splits}")


@pytest.mark.parametrize("case", CASES, ids=[_name(c) for c in CASES])
def test_decode_kernel_against_float64(case):
    _check_case(case, block_n=32)


# (block_n, page): a block of several pages, of part of one, and pages that end inside a block (the
# paged walk steps its page index and slot by block_n keys without a division); four splits and a
# window, so that programs start past key 0
PAGE_WALKS = [(64, 16), (64, 48), (32, 80), (128, 48), (32, 128), (64, 256)]


@pytest.mark.parametrize("block_n,page", PAGE_WALKS, ids=[f"bn{b}_page{p}" for b, p in PAGE_WALKS])
def test_paged_walk_against_float64(block_n, page):
    _check_case(("bf16", 2, 2, 4, 2, 64, 520, True, (300, -1), 0.0, page, 4), block_n=block_n)


# (case, block_n): split calls, contiguous and paged, GQA-packed rows, a window
FUSED = [(("bf16", 3, 1, 8, 2, 64, 203, True, (-1, -1), 0.0, 0, 3), 32),
         (("fp16", 2, 4, 8, 1, 128, 211, True, (60, -1), 0.0, 16, 4), 32),
         (("bf16", 2, 1, 4, 2, 64, 150, False, (-1, -1), 0.0, 0, 1), 32)]  # one split: no merge, no counter use


@pytest.mark.parametrize("case, block_n", FUSED, ids=[_name(c) for c, _ in FUSED])
def test_fused_merge_matches_float64_and_leaves_the_counters_at_zero(case, block_n):
    """merge="fused" (DecodeConfig): the split kernel's last program of each row merges the row's
    splits (a counter per row, no combine launch). Against float64 as the two-launch form, run
    twice on one counter tensor, which the kernel leaves at zero each time; the counter is poisoned
    nowhere but checked to be zero before and after."""
    counter = torch.zeros(case[1] * case[4], dtype=torch.int32)
    for _ in range(2):
        launches = _check_case(case, block_n, counter=counter, merge="fused")
        assert [la.fn.__name__ for la in launches] == ["_attn_decode"]
        assert launches[0].values["FUSED"] is (case[-1] > 1), launches[0].values["FUSED"]
        assert not counter.any(), counter


def test_fused_merge_rule():
    """"fused" merges in the split kernel whenever the call has slices to merge; "launch", the
    default, never does; anything else is refused with the field named."""
    launch, fused = (fd.DecodeConfig(64, 4, 2, merge=m) for m in ("launch", "fused"))
    assert fd.DecodeConfig(64, 4, 2).merge == "launch"
    assert [fd.fused_merge(fused, k) for k in (1, 2, 16, 128)] == [False, True, True, True]
    assert not any(fd.fused_merge(launch, k) for k in (1, 2, 16, 128))
    assert fd.check_decode(KernelSpec("decode", "bf16", "sm90", 128, 128, 4, "causal"),
                           fd.DecodeConfig(64, 4, 2, merge="auto")) == "merge is one of launch, fused, got 'auto'"


def _check_case(case, block_n, mod=None, counter=None, merge="launch"):
    dt, B, sq, hq, hkv, d, cap, causal, window, softcap, page, splits = case
    dtype = DTYPES[dt]
    mask, wl, wr = mask_kind(causal, window)
    spec = KernelSpec("decode", dt, "sm80", d, d, hq // hkv, mask, softcap > 0, False)
    mod = mod or loader.load(spec)
    k_cache, v_cache, table = make_cache(B, cap, hkv, d, dtype, page, seed=1)
    q, = random_inputs((B, sq, hq, d), dtype=dtype, seed=2, mults=[3.0 if softcap else 1.0])
    capacity = table.shape[1] * page if page else cap
    lens = [1] + [int(x) for x in torch.randint(sq, capacity + 1, (B - 1,), generator=torch.Generator().manual_seed(3))]
    lens[-1] = capacity  # a full row
    seqlens = torch.tensor(lens, dtype=torch.int32)
    cfg = fd.DecodeConfig(block_n, 4, 1, splits, merge)
    n, split_len = fd.splits(cfg, B, hkv, capacity, 2)
    out = torch.full((B, sq, hq, d), float("nan"), dtype=dtype)
    lse = torch.full((B, hq, sq), float("nan"))
    op_shape, lp_shape = fd.partial_shapes(B, hkv, n, fd.rows_tile(hq // hkv, sq), d)
    op, lp = torch.full(op_shape, float("nan")), torch.full(lp_shape, float("nan"))
    scale = 1.0 / math.sqrt(d)
    margs = MaskArgs(scale, softcap, wl, wr, False)
    launches = fd.decode_launches(mod, spec, q, k_cache, v_cache, out, lse, op, lp, margs, cfg, n, split_len,
                                  seqlens, table, counter=counter)
    for la in launches:
        la.run()
    kr, vr = rows_view(k_cache, table, B), rows_view(v_cache, table, B)
    o64, l64 = reference(q, kr, vr, lens, causal, window, softcap, scale)
    opt, _ = reference(q, kr, vr, lens, causal, window, softcap, scale, upcast=False)
    assert_flash_rule(_name(case), out, o64, opt, 2.0)
    assert_lse_close(_name(case) + " lse", lse, l64)
    if splits > 1:
        assert 1 < n <= splits  # forced: that many slices, fewer when block_n rounding covers the keys sooner
    return launches


def test_splits_come_from_shapes_only():
    """The split count and length follow batch, KV heads, capacity and SMs; every key is covered."""
    cfg = fd.DecodeConfig(64, 4, 2)
    for B, hkv, cap, sms in [(1, 8, 32768, 132), (8, 8, 32768, 132), (64, 8, 4096, 132), (1, 1, 100, 132),
                             (4, 2, 1000, 2)]:
        n, length = fd.splits(cfg, B, hkv, cap, sms)
        assert 1 <= n <= fd.MAX_SPLITS and length % 64 == 0 and n * length >= cap and (n - 1) * length < cap
        assert length >= min(fd.MIN_SPLIT_KEYS, -(-cap // 64) * 64) or n == 1
    assert fd.splits(cfg, 1, 8, 32768, 132)[0] >= 16  # one row of a long cache fills the GPU
    assert fd.splits(cfg, 64, 8, 4096, 132)[0] == 1  # 512 programs already


@pytest.mark.parametrize("paged", [False, True])
def test_attention_with_kvcache_appends_in_place(paged):
    """New k / v land in the cache at cache_seqlens (pages through the block table) and the same
    call attends to them; cache_seqlens is not changed; rows of other positions stay as they were."""
    B, hq, hkv, d, cap, page = 3, 4, 2, 64, 96, 16
    dtype = torch.bfloat16
    k_cache, v_cache, table = make_cache(B, cap, hkv, d, dtype, page if paged else 0, seed=5)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    q, k_new, v_new = random_inputs((B, 2, hq, d), (B, 2, hkv, d), (B, 2, hkv, d), dtype=dtype, seed=6)
    seqlens = torch.tensor([0, 17, 94], dtype=torch.int32)
    with torch.no_grad():
        out, lse = attngen.attention_with_kvcache(q, k_cache, v_cache, seqlens, k=k_new, v=v_new, block_table=table,
                                                  return_lse=True)
    assert seqlens.tolist() == [0, 17, 94]
    kr, vr = rows_view(k_cache, table, B), rows_view(v_cache, table, B)
    kb, vb = rows_view(before_k, table, B), rows_view(before_v, table, B)
    for b, s in enumerate(seqlens.tolist()):
        assert torch.equal(kr[b, s:s + 2], k_new[b]) and torch.equal(vr[b, s:s + 2], v_new[b])
        keep = torch.ones(kr.shape[1], dtype=torch.bool)
        keep[s:s + 2] = False
        assert torch.equal(kr[b][keep], kb[b][keep]) and torch.equal(vr[b][keep], vb[b][keep])
    lens = [s + 2 for s in seqlens.tolist()]
    o64, l64 = reference(q, kr, vr, lens, True, (-1, -1), 0.0, 1 / math.sqrt(d))
    opt, _ = reference(q, kr, vr, lens, True, (-1, -1), 0.0, 1 / math.sqrt(d), upcast=False)
    assert_flash_rule("append", out, o64, opt, 2.0)
    assert_lse_close("append lse", lse, l64)


@pytest.mark.parametrize("merge", ["launch", "fused"])
def test_attention_with_kvcache_merge_forms(merge):
    """A split call with merge "fused" (forced here; the tuner may pick it per bucket) is one launch
    whose last program per row merges the slices, on the plan's counter; "launch" keeps the combine
    launch and no counter. Three calls (the first builds the plan, the others replay it), each
    against float64; the counters end at zero."""
    from attngen.runtime import kvcache
    from attngen.runtime.dispatch import forced_config

    B, hq, hkv, d, cap = 2, 8, 2, 64, 16 * 32  # 16 slices of 32-key steps
    dtype = torch.bfloat16
    k_cache, v_cache, _ = make_cache(B, cap, hkv, d, dtype, 0, seed=8)
    kvcache._FAST.clear()
    with forced_config(decode=fd.DecodeConfig(32, 4, 1, 16, merge)):
        for call in range(3):
            q, = random_inputs((B, 1, hq, d), dtype=dtype, seed=9 + call)
            seqlens = torch.tensor([cap - 5 * call, 300 + call], dtype=torch.int32)
            with torch.no_grad():
                out, lse = attngen.attention_with_kvcache(q, k_cache, v_cache, seqlens, return_lse=True)
            lens = seqlens.tolist()
            o64, l64 = reference(q, k_cache, v_cache, lens, True, (-1, -1), 0.0, 1 / math.sqrt(d))
            opt, _ = reference(q, k_cache, v_cache, lens, True, (-1, -1), 0.0, 1 / math.sqrt(d), upcast=False)
            assert_flash_rule(f"call {call}", out, o64, opt, 2.0)
            assert_lse_close(f"call {call} lse", lse, l64)
    (plan, _, _), = kvcache._FAST.values()
    assert plan.num_splits == 16 and plan.config_source == "forced"
    names = [la.fn.__name__ for la in plan.launches_spec]
    if merge == "fused":
        assert plan.fused and names == ["_attn_decode"], names
        (counter,) = plan.counters.values()
        assert counter.shape == (B * hkv,) and not counter.any(), counter
    else:
        assert not plan.fused and not plan.counters and names == ["_attn_decode", "_attn_decode_combine"], names


def test_dense_attention_with_a_short_query_runs_the_decode_family():
    """attention() with Sq <= 16 on a long KV goes to the decode kernels (bhsd and bshd), the LSE in
    the forward's layout; its gradient comes from the backward family."""
    B, hq, hkv, sq, sk, d = 1, 8, 1, 3, 700, 64  # one (row, KV head): the interpreter's 2 SMs want 3 splits
    q, k, v, dout = random_inputs((B, hq, sq, d), (B, hkv, sk, d), (B, hkv, sk, d), (B, hq, sq, d),
                                  dtype=torch.float16, seed=7)
    info = attngen.explain(q, k, v, causal=True)
    assert [la["entry"] for la in info["launches"]] == ["_attn_decode", "_attn_decode_combine"], info["launches"]
    assert info["splits"]["num_splits"] > 1 and info["kernel"].startswith("attn_decode_")
    out, lse = attngen.attention(q, k, v, causal=True, return_lse=True)
    o64, l64 = attention_ref(q, k, v, causal=True)
    opt, _ = attention_ref(q, k, v, causal=True, upcast=False)
    assert_flash_rule("dense decode", out, o64, opt, 2.0)
    assert_lse_close("dense decode lse", lse, l64)
    out_s = attngen.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, layout="bshd")
    assert torch.equal(out_s.transpose(1, 2), out)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    grads = torch.autograd.grad(attngen.attention(*leaves, causal=True), leaves, dout)
    from attngen.testing import check_grads

    check_grads("dense decode", lambda q, k, v, upcast: attention_ref(q, k, v, causal=True, upcast=upcast)[0],
                (q, k, v), dout, grads)


def test_torch_compile_fullgraph_kvcache():
    """The custom op declares the mutated caches: a compiled call appends and attends as eager does."""
    B, hq, hkv, d, cap = 2, 4, 1, 32, 64
    k_cache, v_cache, _ = make_cache(B, cap, hkv, d, torch.float16, 0, seed=8)
    q, k_new, v_new = random_inputs((B, 1, hq, d), (B, 1, hkv, d), (B, 1, hkv, d), dtype=torch.float16, seed=9)
    seqlens = torch.tensor([5, 40], dtype=torch.int32)

    def fn(q, kc, vc, s, kn, vn):
        return attngen.attention_with_kvcache(q, kc, vc, s, k=kn, v=vn)

    kc1, vc1, kc2, vc2 = k_cache.clone(), v_cache.clone(), k_cache.clone(), v_cache.clone()
    with torch.no_grad():
        out = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, kc1, vc1, seqlens, k_new, v_new)
        ref = fn(q, kc2, vc2, seqlens, k_new, v_new)
    assert torch.equal(out, ref) and torch.equal(kc1, kc2) and torch.equal(vc1, vc2)
    assert torch.equal(kc1[0, 5], k_new[0, 0]) and torch.equal(vc1[1, 40], v_new[1, 0])


BAD = [
    (dict(q=(2, 17, 4, 64)), "q: 17 query tokens"),
    (dict(block_table="float"), "block_table: expected an int32"),
    (dict(page=24), "page size 24 is not a multiple of 16"),
    (dict(seqlens="int64"), "cache_seqlens: expected an int32"),
    (dict(k_only=True), "k, v: pass both"),
    (dict(no_seqlens_new=True), "cache_seqlens: required with new k / v"),
    (dict(v_heads=3), "v_cache: shape"),
    (dict(num_splits=-1), "num_splits: must be an int"),
    (dict(grad=True), "inference only"),
]


@pytest.mark.parametrize("change,message", BAD, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_bad_input_names_the_argument(change, message):
    B, hq, hkv, d, page = 2, 4, 2, 64, change.get("page", 16)
    q = torch.randn(*change.get("q", (B, 1, hq, d)), dtype=torch.float16)
    k_cache = torch.randn(6, page, hkv, d, dtype=torch.float16)
    v_cache = torch.randn(6, page, change.get("v_heads", hkv), d, dtype=torch.float16)
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.float32 if change.get("block_table") else torch.int32)
    seqlens = torch.tensor([3, 9], dtype=torch.int64 if change.get("seqlens") else torch.int32)
    kw = {"block_table": table}
    if change.get("k_only"):
        kw["k"] = torch.randn(B, 1, hkv, d, dtype=torch.float16)
    if change.get("no_seqlens_new"):
        kw.update(k=torch.randn(B, 1, hkv, d, dtype=torch.float16), v=torch.randn(B, 1, hkv, d, dtype=torch.float16))
        seqlens = None
    if "num_splits" in change:
        kw["num_splits"] = change["num_splits"]
    if change.get("grad"):
        q.requires_grad_(True)
    with pytest.raises(ValueError, match=message):
        attngen.attention_with_kvcache(q, k_cache, v_cache, seqlens, **kw)


def _generated_decode_kernels():
    from tests.kernels.cases import built_kernels

    return built_kernels("decode")


@pytest.mark.parametrize("spec,path", _generated_decode_kernels(), ids=lambda x: getattr(x, "uri", ""))
def test_every_generated_decode_kernel(spec, path):
    """Every generated decode kernel (one per distinct body): its committed module, run on a
    paged cache with two splits and ragged lengths, passes the 2x rule and matches its golden
    output (tests/golden/decode)."""
    from attngen.runtime.loader import load_path
    from tests.kernels import golden

    dtype = DTYPES[spec.dtype]
    mod = load_path(path)
    B, sq, hkv, page, cap = 2, 2, 2, 16, 80
    hq = hkv * spec.gqa_ratio
    k_cache, v_cache, table = make_cache(B, cap, hkv, spec.head_dim_qk, dtype, page, seed=11)
    if spec.head_dim_v != spec.head_dim_qk:
        v_cache, = random_inputs(k_cache.shape[:3] + (spec.head_dim_v,), dtype=dtype, seed=12)
    q, = random_inputs((B, sq, hq, spec.head_dim_qk), dtype=dtype, seed=13, mults=[3.0 if spec.softcap else 1.0])
    lens = [37, cap]
    window = (20, 0) if spec.mask == "sliding_window" else (-1, -1)
    causal = spec.mask != "none"
    softcap = 30.0 if spec.softcap else 0.0
    scale = 1.0 / math.sqrt(spec.head_dim_qk)
    _, wl, wr = mask_kind(causal, window)
    cfg = fd.DecodeConfig(32, 4, 1, 2)
    n, split_len = fd.splits(cfg, B, hkv, cap, 2)
    out = torch.full((B, sq, hq, spec.head_dim_v), float("nan"), dtype=dtype)
    lse = torch.full((B, hq, sq), float("nan"))
    ps, ls = fd.partial_shapes(B, hkv, n, fd.rows_tile(spec.gqa_ratio, sq), spec.head_dim_v)
    for la in fd.decode_launches(mod, spec, q, k_cache, v_cache, out, lse, torch.full(ps, float("nan")),
                                 torch.full(ls, float("nan")), MaskArgs(scale, softcap, wl, wr, False), cfg, n,
                                 split_len, torch.tensor(lens, dtype=torch.int32), table):
        la.run()
    kr, vr = rows_view(k_cache, table, B), rows_view(v_cache, table, B)
    o64, l64 = reference(q, kr, vr, lens, causal, window, softcap, scale)
    opt, _ = reference(q, kr, vr, lens, causal, window, softcap, scale, upcast=False)
    err, _ = assert_flash_rule(spec.uri, out, o64, opt, 2.0)
    assert_lse_close(spec.uri + " lse", lse, l64)
    lerr = (lse.double() - l64).abs().max().item()
    golden.check("decode", spec.uri, "paged_split2", {"out": out, "lse": lse}, {"out": err, "lse": lerr})


# an fp8 cache: (paged or not, new tokens, one descale for every batch row, q's magnitude)
FP8_KV = [(0, 0, False, 1.0), (16, 3, True, 1.0), (0, 2, False, 1.0), (0, 0, False, 3e4), (16, 0, True, 1e-6)]


@pytest.mark.parametrize("page,new,shared,q_mag", FP8_KV, ids=[f"page{p}_new{n}_q{m:g}" for p, n, _, m in FP8_KV])
def test_fp8_kv_cache_against_float64(page, new, shared, q_mag):
    """e4m3 caches with fp32 descales (B, Hkv): against float64 attention on the dequantized cache
    (x8 * descale), the 2x rule against PyTorch in q's dtype on the same cache; new k / v are
    divided by the descales and rounded to e4m3 into the cache, and seen by the call. A paged pool
    is shared by the batch rows, so its descales are the same for each row (shared). The kernel's
    dots run in fp16 on an e4m3 cache: a q beyond fp16's range (3e4 x N(0, 1)) or in its
    subnormals (1e-6 x N(0, 1)), with the softmax scale divided by the same factor, must come out
    as accurate as q of unit size."""
    B, sq, hq, hkv, d, cap = 3, 2, 8, 2, 64, 150
    E4 = torch.float8_e4m3fn
    k_src, v_src, table = make_cache(B, cap, hkv, d, torch.bfloat16, page, seed=21)
    g = torch.Generator().manual_seed(22)
    kd, vd = (torch.rand(1 if shared else B, hkv, generator=g) * 0.05 + 0.01 for _ in range(2))
    kd, vd = kd.expand(B, hkv).contiguous(), vd.expand(B, hkv).contiguous()

    def quant(x, ds):  # (rows, n, Hkv, D) / ds (rows, Hkv), the cache's first dim
        return (x.float() / ds[:x.shape[0], None, :, None]).clamp(-448, 448).to(E4)
    k8 = quant(k_src, kd if not page else kd[:1].expand(k_src.shape[0], hkv))
    v8 = quant(v_src, vd if not page else vd[:1].expand(v_src.shape[0], hkv))
    q, k_new, v_new = random_inputs((B, sq, hq, d), (B, max(new, 1), hkv, d), (B, max(new, 1), hkv, d),
                                    dtype=torch.bfloat16, seed=23)
    q = (q.float() * q_mag).to(q.dtype)
    scale = 1 / (math.sqrt(d) * q_mag)
    capacity = table.shape[1] * page if page else cap
    seqlens = torch.tensor([0, 77, capacity - new], dtype=torch.int32)
    kw = dict(k=k_new, v=v_new) if new else {}
    with torch.no_grad():
        out, lse = attngen.attention_with_kvcache(q, k8, v8, seqlens, block_table=table, return_lse=True,
                                                  k_descale=kd, v_descale=vd, scale=scale, **kw)
    kr, vr = rows_view(k8, table, B), rows_view(v8, table, B)
    if new:  # the new tokens in the cache, rounded as the caller's quantization would
        for b, s in enumerate(seqlens.tolist()):
            assert torch.equal(kr[b, s:s + new].view(torch.uint8), quant(k_new[b:b + 1], kd[b:b + 1])[0].view(torch.uint8))
            assert torch.equal(vr[b, s:s + new].view(torch.uint8), quant(v_new[b:b + 1], vd[b:b + 1])[0].view(torch.uint8))
    kf = kr.double() * kd.double()[:, None, :, None]
    vf = vr.double() * vd.double()[:, None, :, None]
    lens = [s + new for s in seqlens.tolist()]
    o64, l64 = reference(q, kf, vf, lens, True, (-1, -1), 0.0, scale)
    opt, _ = reference(q, kf.to(q.dtype), vf.to(q.dtype), lens, True, (-1, -1), 0.0, scale, upcast=False)
    assert_flash_rule(f"fp8 cache page {page} q x {q_mag:g}", out, o64, opt, 2.0)
    assert_lse_close("fp8 cache lse", lse, l64)


@pytest.mark.parametrize("change,message", [
    ("bf16_cache", "k_descale: only for float8_e4m3fn caches"),
    ("shape", r"v_descale: expected shape \(2, 2\)"),
    ("dtype", "k_descale: expected an fp32"),
    ("fp16_cache_mix", "v_cache: dtype"),
])
def test_fp8_cache_bad_descales_name_the_argument(change, message):
    B, hq, hkv, d, S = 2, 4, 2, 64, 32
    q = torch.randn(B, 1, hq, d, dtype=torch.bfloat16)
    k8 = torch.randn(B, S, hkv, d).to(torch.float8_e4m3fn)
    v8 = k8.clone()
    kd, vd = torch.ones(B, hkv), torch.ones(B, hkv)
    if change == "bf16_cache":
        k8, v8 = k8.bfloat16(), v8.bfloat16()
    elif change == "shape":
        vd = torch.ones(B, hkv, 1)
    elif change == "dtype":
        kd = kd.double()
    else:
        v8 = v8.bfloat16()
    with pytest.raises(ValueError, match=message):
        attngen.attention_with_kvcache(q, k8, v8, k_descale=kd, v_descale=vd)
