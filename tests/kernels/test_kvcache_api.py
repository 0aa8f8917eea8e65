"""attention_with_kvcache's flash-attn arguments (issue 49): cache_batch_idx, cache_leftpad and the
fused rotary embedding (rotary_cos / rotary_sin / rotary_interleaved), in Triton's interpreter.

Each case runs the public call with its output, LSE and split buffers poisoned with NaN, and checks
it against a float64 reference written here from flash-attn's definitions (flash-attn's 2x rule
against PyTorch in the inputs' precision, tests/kernels/test_decode.reference per row):
* cache_batch_idx: batch row b reads and appends to cache row cache_batch_idx[b];
* cache_leftpad: row b's keys are cache positions [pad, cache_seqlens + new), numbered from the pad
  for causal / window masks;
* rotary: new key t rotated at position cache_seqlens + t, query token i at cache_seqlens + i when
  causal or local, else at cache_seqlens (positions from cache position 0, pad included); the
  float64 reference rotates in float64, the yardstick in fp32 rounded to the dtype once, as the
  kernels do.
The caches after the append must hold exactly the rotated new keys (fp32 rotation rounded once)
and nothing else changed. Metadata out of range (a cache row outside the cache, a pad outside
[0, cache_seqlens]) runs in a subprocess as tests/kernels/test_kvcache_guard.py's cases do: the
public call's named error, and the bare kernels' flagged clamp. The same cases on a GPU:
tests/gpu/test_gpu_kvcache_api.py."""

from __future__ import annotations

import math

import pytest
import torch

import attngen
from attngen.problem import random_inputs
from attngen.runtime import kvcache
from attngen.testing import assert_flash_rule, assert_lse_close
from tests.kernels.test_decode import DTYPES, make_cache, reference
from tests.kernels.test_kvcache_guard import close, isolated, run_kernels

HQ_PER_KV = 2  # GQA 2

# (dtype, B, Sq, Hkv, D, capacity, new tokens, causal, window, page, cache_batch_idx ("perm": a
#  permutation of the cache rows, "subset": B of B + 2 rows), left pads, rotary_dim (0: none),
#  interleaved, the tables' dtype ("q": q's, "fp32"), num_splits)
CASES = [
    ("fp16", 3, 1, 2, 64, 80, 1, True, (-1, -1), 0, "perm", False, 0, False, "q", 3),
    ("bf16", 3, 2, 1, 32, 70, 0, False, (-1, -1), 0, "subset", False, 0, False, "q", 2),
    ("fp16", 3, 2, 2, 32, 96, 2, True, (-1, -1), 0, None, True, 0, False, "q", 3),
    ("bf16", 2, 3, 2, 64, 90, 0, True, (20, -1), 0, "perm", True, 0, False, "q", 2),
    ("fp16", 2, 2, 2, 32, 64, 2, True, (-1, -1), 0, None, False, 32, False, "q", 2),
    ("bf16", 3, 1, 2, 64, 64, 1, True, (-1, -1), 16, None, False, 32, True, "fp32", 3),
    ("fp16", 2, 3, 2, 64, 80, 2, False, (-1, -1), 0, "subset", True, 48, True, "q", 2),
    ("bf16", 2, 2, 1, 32, 64, 2, True, (16, -1), 32, None, False, 16, False, "q", 0),
]


def _name(c):
    dt, B, sq, hkv, d, cap, new, causal, window, page, batch, pad, rot, inter, tab, splits = c
    return (f"{dt}_b{B}_sq{sq}_hkv{hkv}_hd{d}_cap{cap}_new{new}{'_causal' if causal else ''}"
            f"{'_w%dx%d' % window if window != (-1, -1) else ''}{'_page%d' % page if page else ''}"
            f"{'_idx-' + batch if batch else ''}{'_leftpad' if pad else ''}"
            f"{'_rot%d%s%s' % (rot, 'i' if inter else 'n', tab) if rot else ''}_s{splits}")


def rotary_ref(x, cos, sin, pos, interleaved: bool):
    """x (B, S, H, D) rotated at positions pos (B, S) over its first 2 x cos.shape[1] dims, in the
    precision of the tensors given (flash-attn's definition: interleaved pairs (2i, 2i + 1), else
    halves (i, i + rotary_dim / 2), both at angle i)."""
    half = cos.shape[1]
    c, s = cos[pos.long()][:, :, None], sin[pos.long()][:, :, None]
    r = x[..., :2 * half]
    if interleaved:
        x1, x2 = r[..., 0::2], r[..., 1::2]
        rot = torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], -1).flatten(-2)
    else:
        x1, x2 = r[..., :half], r[..., half:]
        rot = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)
    return torch.cat([rot, x[..., 2 * half:]], -1)


def to_dtype(x, dtype, truncate: bool = False):
    """x (fp32) rounded to dtype: to nearest even, as torch and the GPU's conversion do, or with
    truncate toward zero, as Triton 3.6's interpreter converts fp32 to bf16 (its cast drops the
    low 16 bits; fp16 it rounds to nearest)."""
    if truncate and dtype == torch.bfloat16:
        return (x.float().view(torch.int32) & -65536).view(torch.float32).to(dtype)
    return x.to(dtype)


def make(case, seed: int = 0, device="cpu") -> dict:
    """A case's call: q, caches, table, cache_seqlens, new k / v, indices, rotary tables."""
    dt, B, sq, hkv, d, cap, new, causal, window, page, batch, pad, rot, inter, tab, splits = case
    dtype = DTYPES[dt]
    g = torch.Generator().manual_seed(seed)
    rows = B + 2 if batch == "subset" else B
    kc, vc, table = make_cache(rows, cap, hkv, d, dtype, page, seed=seed + 1, device=device)
    capacity = table.shape[1] * page if page else cap
    q, kn, vn = random_inputs((B, sq, hkv * HQ_PER_KV, d), (B, max(new, 1), hkv, d), (B, max(new, 1), hkv, d),
                              dtype=dtype, device=device, seed=seed + 2)
    lens = torch.randint(0, capacity - new + 1, (B,), generator=g)
    lens[0] = 0 if new else 1  # a row whose keys are all new (or one key)
    lens[-1] = capacity - new  # a full row
    t = {"q": q, "k_cache": kc, "v_cache": vc, "block_table": table, "k": kn if new else None,
         "v": vn if new else None, "cache_seqlens": lens.to(torch.int32).to(device), "causal": causal,
         "window_size": window, "num_splits": splits, "rotary_interleaved": inter}
    if batch:
        idx = torch.randperm(rows, generator=g)[:B]
        t["cache_batch_idx"] = idx.to(torch.int32).to(device)
    if pad:
        pads = (torch.rand(B, generator=g) * (lens + 1).float()).long().clamp(max=lens)
        pads[0] = lens[0]  # no key before the new ones
        t["cache_leftpad"] = pads.to(torch.int32).to(device)
    if rot:
        angle = torch.rand(capacity + sq, rot // 2, generator=g) * 2 * math.pi
        tdt = torch.float32 if tab == "fp32" else dtype
        t["rotary_cos"], t["rotary_sin"] = angle.cos().to(tdt).to(device), angle.sin().to(tdt).to(device)
    return t


def expected(t: dict, truncate: bool = False):
    """flash-attn's semantics on a CPU copy of call t: {k_cache, v_cache: after the append;
    out64, lse64_exact: rotated in float64; lse64: of the rotated inputs rounded as the kernels
    store them; out_pt, lse_pt: PyTorch in the dtype, rotated in fp32}. truncate: the device
    rounds fp32 to bf16 toward zero (to_dtype). Out-of-range metadata follows the kernels' clamps (the template's
    comment): a cache_batch_idx outside the cache gives a row no key and writes nothing; a pad is
    clamped into [0, cache_seqlens (clamped)]."""
    t = {n: (x.cpu() if isinstance(x, torch.Tensor) else x) for n, x in t.items()}
    q, kc, vc, table = t["q"], t["k_cache"].clone(), t["v_cache"].clone(), t["block_table"]
    B, sq = q.shape[:2]
    kn, vn = t["k"], t["v"]
    new = 0 if kn is None else kn.shape[1]
    page = kc.shape[1] if table is not None else 0
    cap = table.shape[1] * page if page else kc.shape[1]
    lens = t["cache_seqlens"].long()
    idx = t.get("cache_batch_idx")
    cache_row = idx.long() if idx is not None else torch.arange(B)
    row_ok = (cache_row >= 0) & (cache_row < kc.shape[0])
    cached = lens.clamp(0, cap - new)
    pads = t.get("cache_leftpad")
    pads = torch.zeros(B, dtype=torch.long) if pads is None else torch.minimum(pads.long().clamp(min=0), cached)
    cos, sin = t.get("rotary_cos"), t.get("rotary_sin")
    per_token = t["causal"] or tuple(t["window_size"]) != (-1, -1)
    qpos = cached[:, None] + (torch.arange(sq)[None, :] if per_token else 0)
    kpos = lens[:, None] + torch.arange(new)[None, :]
    inter = t["rotary_interleaved"]
    if cos is not None:
        q32 = rotary_ref(q.float(), cos.float(), sin.float(), qpos, inter)
        q64 = rotary_ref(q.double(), cos.double(), sin.double(), qpos, inter)
        qpt, qdev = q32.to(q.dtype), to_dtype(q32, q.dtype, truncate)
        k64 = rotary_ref(kn.double(), cos.double(), sin.double(), kpos, inter)
        knew = to_dtype(rotary_ref(kn.float(), cos.float(), sin.float(), kpos, inter), q.dtype, truncate)
    else:
        q64, qpt, qdev, k64, knew = q.double(), q, q, None if kn is None else kn.double(), kn

    def at(b, pos):  # where key positions pos (tensor) of rows b sit in the caches
        return (table[b, pos // page].long(), pos % page) if page else (cache_row[b].clamp(0, kc.shape[0] - 1), pos)

    for b in range(B):
        for j in range(new):
            if row_ok[b] and 0 <= int(lens[b]) and int(lens[b]) + j < cap:
                where = at(torch.tensor(b), lens[b] + j)
                kc[where], vc[where] = knew[b, j], vn[b, j]
    hkv, d = kc.shape[2:]
    n = (cached + new - pads).where(row_ok, torch.zeros_like(cached))
    j = torch.arange(max(int(n.max()), 1))[None, :]
    used = (j < n[:, None])[:, :, None, None]
    pos = (pads[:, None] + j).clamp(max=cap - 1)  # (B, keys): each row's keys, numbered from its pad
    where = at(torch.arange(B)[:, None].expand_as(pos), pos)
    kptr = kc[where].masked_fill(~used, 0.0)
    v64r = vc[where].double().masked_fill(~used, 0.0)
    k64r = kptr.double()
    if kn is not None:  # the new keys in float64 (rotated in float64)
        new_j = pos - lens[:, None]
        is_new = used[:, :, 0, 0] & (new_j >= 0) & (new_j < new)
        k64r[is_new] = k64[torch.arange(B)[:, None].expand_as(pos)[is_new], new_j[is_new]]
    scale = 1.0 / math.sqrt(d)
    lens_k = n.tolist()
    mask = (lens_k, t["causal"], t["window_size"], 0.0, scale)
    o64, l64_exact = reference(q64, k64r, v64r, *mask)
    opt, lpt = reference(qpt, kptr, v64r.to(q.dtype), *mask, upcast=False)
    # the LSE of the rotated inputs as the kernels hold them (rounded to the dtype once): an fp32
    # LSE is checked to 1e-4, below the rounding of a rotated q
    _, l64 = reference(qdev.double(), kptr.double(), v64r, *mask)
    return {"k_cache": kc, "v_cache": vc, "out64": o64, "lse64": l64, "out_pt": opt, "lse64_exact": l64_exact,
            "lse_pt": lpt}


API_ARGS = ("k", "v", "block_table", "causal", "window_size", "num_splits", "cache_batch_idx", "cache_leftpad",
            "rotary_cos", "rotary_sin", "rotary_interleaved")


def call(t: dict, **kw):
    """attention_with_kvcache on call t (out, lse)."""
    args = {n: t[n] for n in API_ARGS if n in t}
    with torch.no_grad():
        return attngen.attention_with_kvcache(t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"],
                                              return_lse=True, **args, **kw)


@pytest.fixture
def poisoned(monkeypatch):
    """The decode plans' outputs and split buffers filled with NaN before each launch."""
    empty, partials = kvcache.DecodePlan.empty, kvcache.DecodePlan.partials

    def fill(ts):
        return tuple(None if x is None else x.fill_(float("nan")) for x in ts)

    monkeypatch.setattr(kvcache.DecodePlan, "empty", lambda self: fill(empty(self)))
    monkeypatch.setattr(kvcache.DecodePlan, "partials", lambda self: fill(partials(self)))


def check_case(case, device="cpu") -> tuple[float, float]:
    """One case on `device` (poisoned outputs: the caller's fixture); (err, PyTorch's err). On a
    GPU the rotated q may round differently (the split kernel's rotation may fuse a multiply-add),
    so its LSE takes flash-attn's 2x rule against the float64 rotation there."""
    t = make(case, device=device)
    want = expected(t, truncate=device == "cpu")
    out, lse = call(t)
    name = _name(case)
    assert torch.equal(t["k_cache"].cpu(), want["k_cache"]), f"{name}: k_cache after the append differs"
    assert torch.equal(t["v_cache"].cpu(), want["v_cache"]), f"{name}: v_cache after the append differs"
    errs = assert_flash_rule(name, out.cpu(), want["out64"], want["out_pt"], 2.0)
    if device == "cpu" or "rotary_cos" not in t:
        assert_lse_close(name + " lse", lse.cpu(), want["lse64"])
    else:
        assert_flash_rule(name + " lse", lse.cpu(), want["lse64_exact"], want["lse_pt"], 2.0, 1e-4)
    attngen.check_kvcache()  # nothing flagged
    return errs


@pytest.mark.parametrize("case", CASES, ids=[_name(c) for c in CASES])
def test_kvcache_api_against_float64(case, poisoned):
    check_case(case)


def test_torch_compile_takes_the_new_arguments():
    """The custom op carries cache_batch_idx, cache_leftpad and the rotary tables: a compiled call
    appends and attends exactly as eager does."""
    case = ("fp16", 2, 2, 2, 32, 64, 2, True, (-1, -1), 0, "subset", True, 16, True, "q", 2)
    a, b = make(case), make(case)

    def fn(q, kc, vc, s, kn, vn, idx, pad, cos, sin):
        return attngen.attention_with_kvcache(q, kc, vc, s, k=kn, v=vn, cache_batch_idx=idx, cache_leftpad=pad,
                                              rotary_cos=cos, rotary_sin=sin, rotary_interleaved=True)

    names = ("q", "k_cache", "v_cache", "cache_seqlens", "k", "v", "cache_batch_idx", "cache_leftpad", "rotary_cos",
             "rotary_sin")
    with torch.no_grad():
        out = torch.compile(fn, fullgraph=True, backend="aot_eager")(*(a[n] for n in names))
        ref = fn(*(b[n] for n in names))
    assert torch.equal(out, ref)
    assert torch.equal(a["k_cache"], b["k_cache"]) and torch.equal(a["v_cache"], b["v_cache"])


def test_expressions_count_from_the_pad(poisoned):
    """A mask expression sees the row's keys numbered from its left pad (q_idx = kv_len - Sq + i):
    causal plus `kv_idx >= q_idx - 8` must equal the built-in window (8, 0); with rotary, the
    causal call keeps q's per-token positions although the expression takes in the causal mask."""
    case = ("fp16", 3, 2, 2, 32, 64, 2, True, (8, -1), 0, "perm", True, 16, False, "q", 2)
    t = make(case, seed=5)
    want = expected(t, truncate=True)
    t["window_size"] = (-1, -1)
    out, lse = call(t, mask_mod=lambda b, h, q_idx, kv_idx: kv_idx >= q_idx - 8)
    assert torch.equal(t["k_cache"], want["k_cache"]) and torch.equal(t["v_cache"], want["v_cache"])
    assert_flash_rule("expression window", out, want["out64"], want["out_pt"], 2.0)
    assert_lse_close("expression window lse", lse, want["lse64"])


def test_rotary_into_an_e4m3_cache():
    """The new keys are rotated and rounded to their dtype, then divided by the descales and
    rounded to e4m3 (as a caller's rotary followed by its quantization); the call attends to them."""
    case = ("fp16", 2, 1, 2, 32, 48, 1, True, (-1, -1), 0, "perm", False, 32, False, "q", 0)
    t = make(case, seed=9)
    E4 = torch.float8_e4m3fn
    kd, vd = torch.full((2, 2), 0.02), torch.full((2, 2), 0.03)
    t["k_cache"] = (t["k_cache"].float() / 0.02).to(E4)
    t["v_cache"] = (t["v_cache"].float() / 0.03).to(E4)
    k8, v8 = t["k_cache"].clone(), t["v_cache"].clone()
    pos = t["cache_seqlens"].long()[:, None]
    k_ro = rotary_ref(t["k"].float(), t["rotary_cos"].float(), t["rotary_sin"].float(), pos, False).half()
    out = call(t, k_descale=kd, v_descale=vd)[0]
    for b, row in enumerate(t["cache_batch_idx"].tolist()):
        at = int(pos[b])
        k8[row, at] = (k_ro[b, 0].float() / 0.02).to(E4)
        v8[row, at] = (t["v"][b, 0].float() / 0.03).to(E4)
    assert torch.equal(t["k_cache"].view(torch.uint8), k8.view(torch.uint8)), "the rotated keys' e4m3 bytes"
    assert torch.equal(t["v_cache"].view(torch.uint8), v8.view(torch.uint8))
    assert torch.isfinite(out).all()


def _bad(change: str) -> dict:
    t = make(("fp16", 2, 1, 2, 32, 48, 1, True, (-1, -1), 0, "perm", True, 16, False, "q", 0))
    B = 2
    if change == "idx_paged" or change == "pad_paged":
        kc, vc, table = make_cache(B, 48, 2, 32, torch.float16, 16, seed=3)
        t.update(k_cache=kc, v_cache=vc, block_table=table)
        t.pop("cache_leftpad" if change == "idx_paged" else "cache_batch_idx")
    elif change == "idx_int64":
        t["cache_batch_idx"] = t["cache_batch_idx"].long()
    elif change == "idx_shape":
        t["cache_batch_idx"] = t["cache_batch_idx"][:1]
    elif change == "pad_dtype":
        t["cache_leftpad"] = t["cache_leftpad"].float()
    elif change == "rows_without_idx":
        t.pop("cache_batch_idx")
        t["k_cache"], t["v_cache"] = t["k_cache"][:1], t["v_cache"][:1]
    elif change == "cos_only":
        t.pop("rotary_sin")
    elif change == "rotary_no_new":
        t["k"] = t["v"] = None
    elif change == "rotary_dim":
        t["rotary_cos"] = t["rotary_sin"] = torch.zeros(60, 17, dtype=torch.float16)
    elif change == "rotary_short":
        t["rotary_cos"], t["rotary_sin"] = t["rotary_cos"][:40], t["rotary_sin"][:40]
    elif change == "sin_dtype":
        t["rotary_sin"] = t["rotary_sin"].float()
    elif change == "cos_dtype":
        t["rotary_cos"] = t["rotary_sin"] = t["rotary_cos"].double()
    elif change == "interleaved":
        t["rotary_interleaved"] = 1
    return t


BAD = [
    ("idx_paged", "cache_batch_idx: not with a paged cache"),
    ("pad_paged", "cache_leftpad: not with a paged cache"),
    ("idx_int64", "cache_batch_idx: expected an int32"),
    ("idx_shape", r"cache_batch_idx: expected shape \(2,\)"),
    ("pad_dtype", "cache_leftpad: expected an int32"),
    ("rows_without_idx", "k_cache: batch 1 differs from q's 2"),
    ("cos_only", "rotary_sin: pass rotary_cos and rotary_sin together"),
    ("rotary_no_new", "rotary_cos: needs new k / v"),
    ("rotary_dim", r"rotary_cos: expected shape \(seqlen_ro, rotary_dim / 2\)"),
    ("rotary_short", "rotary_cos: 40 positions, fewer than the 48"),
    ("sin_dtype", "rotary_sin: torch.float32"),
    ("cos_dtype", "rotary_cos: expected a torch.float16 or torch.float32"),
    ("interleaved", "rotary_interleaved: must be a bool"),
]


@pytest.mark.parametrize("change,message", BAD, ids=[c for c, _ in BAD])
def test_bad_arguments_name_the_argument(change, message):
    t = _bad(change)
    k0 = t["k_cache"].clone()
    with pytest.raises(ValueError, match=message):
        call(t)
    assert torch.equal(t["k_cache"], k0), f"{change}: the cache changed on an error"


# out of range: name -> (cache_batch_idx, cache_leftpad, the public call's error, flag slots)
RANGE = {
    "idx_past_rows": ([0, 3], None, "cache_batch_idx: row 1 is 3; cache rows are 0 to 2", {3}),
    "idx_negative": ([-1, 1], None, "cache_batch_idx: row 0 is -1", {3}),
    "pad_past_seqlens": (None, [3, 7], "cache_leftpad: row 1 is 7; must be from 0 to the row's cache_seqlens 4",
                         {4}),
    "pad_negative": ([2, 0], [-2, 0], "cache_leftpad: row 0 is -2", {4}),
}


def range_case(name: str) -> dict:
    """Two rows on a dense cache of 3 rows of 32 (the guard tests' D / heads / dtype), one new
    token, cache_seqlens [10, 4]."""
    from tests.kernels import test_kvcache_guard as guard

    idx, pads = RANGE[name][:2]
    g = torch.Generator().manual_seed(7)

    def randn(*shape):
        return torch.randn(shape, generator=g).to(guard.DTYPE)

    t = {"q": randn(2, 1, guard.HQ, guard.D), "k_cache": randn(3, 32, guard.HKV, guard.D),
         "v_cache": randn(3, 32, guard.HKV, guard.D), "block_table": None, "k": randn(2, 1, guard.HKV, guard.D),
         "v": randn(2, 1, guard.HKV, guard.D), "cache_seqlens": torch.tensor([10, 4], dtype=torch.int32),
         "causal": True, "window_size": (-1, -1), "num_splits": 0, "rotary_interleaved": True}
    if idx is not None:
        t["cache_batch_idx"] = torch.tensor(idx, dtype=torch.int32)
    else:
        t["k_cache"], t["v_cache"] = t["k_cache"][:2].contiguous(), t["v_cache"][:2].contiguous()
    if pads is not None:
        t["cache_leftpad"] = torch.tensor(pads, dtype=torch.int32)
    return t


def range_cases() -> None:
    """Every RANGE case: the public call raises naming the argument and writes nothing; the bare
    kernels (no host check) clamp as expected() says, write only the rows' own slots, and flag
    the argument's slot. Run in a subprocess (isolated)."""
    failed = []
    for name, (_, _, message, slots) in RANGE.items():
        try:
            t = range_case(name)
            k0, v0 = t["k_cache"].clone(), t["v_cache"].clone()
            with pytest.raises(ValueError, match=message):
                call(t)
            assert torch.equal(t["k_cache"], k0) and torch.equal(t["v_cache"], v0), "the caches changed on an error"
            want = expected(t)
            out, lse, flags = run_kernels(t["q"], t["k_cache"], t["v_cache"], None, t["cache_seqlens"], t["k"],
                                          t["v"], 0, cache_batch_idx=t.get("cache_batch_idx"),
                                          cache_leftpad=t.get("cache_leftpad"))
            got = {i for i, f in enumerate(flags.tolist()) if f}
            assert got == slots, f"flag slots {got} ({flags.tolist()}), expected {slots}"
            assert torch.equal(t["k_cache"], want["k_cache"]) and torch.equal(t["v_cache"], want["v_cache"]), \
                "the append wrote elsewhere"
            close("out", out, want["out64"])
            close("lse", lse, want["lse64"])
        except Exception as e:  # noqa: BLE001 - each case's failure is reported
            failed.append(f"{name}: {type(e).__name__}: {e}")
    assert not failed, "\n".join(failed)


def test_metadata_out_of_range():
    isolated("range_cases", module="tests.kernels.test_kvcache_api")


def test_strided_metadata_is_refused():
    # the kernels read cache_seqlens[b] at the base + b and a block-table row's entries one after
    # another: a strided view would read other values, so it is an error naming the argument
    q = torch.randn(2, 1, 4, 32, dtype=torch.float16)
    kc = torch.randn(2, 64, 2, 32, dtype=torch.float16)
    lens = torch.tensor([3, 0, 5, 0], dtype=torch.int32)[::2]
    with pytest.raises(ValueError, match="cache_seqlens: must be contiguous"):
        attngen.attention_with_kvcache(q, kc, kc.clone(), lens)
    kp = torch.randn(8, 16, 2, 32, dtype=torch.float16)
    table = torch.arange(8, dtype=torch.int32).reshape(4, 2).t()  # (2, 4), entries strided
    with pytest.raises(ValueError, match="block_table: its entries must be contiguous"):
        attngen.attention_with_kvcache(q, kp, kp.clone(), torch.tensor([3, 5], dtype=torch.int32), block_table=table)
