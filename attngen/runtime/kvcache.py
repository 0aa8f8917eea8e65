"""Decoding on a KV cache: `attngen.attention_with_kvcache` and the decode family's plan.

A short query (1 to 16 tokens) against a contiguous cache (B, S_max, Hkv, D) or a paged one
(num_pages, page_size, Hkv, D) addressed through an int32 block table. New keys and values are
written into the cache in place at cache_seqlens (by the family's append kernel, no host copy)
and seen by the same call; metadata out of range is never followed outside the caches and is
reported as attngen.runtime.kvguard says. The split of the key axis comes from shapes only (attngen.families.decode.splits),
so a call never reads cache_seqlens on the host and can be captured in a CUDA graph. Dense
attention() calls with a short query and a long KV go through the same plan (DensePlan).
"""

from __future__ import annotations

import dataclasses

import torch

from attngen.buckets import bucket_of
from attngen.families import decode as fam_decode
from attngen.families import family
from attngen.kernels.common import MAX_SEQLEN
from attngen.kernels.launch import sm_count
from attngen.runtime import dispatch, kvguard, validate
from attngen.runtime.plan import Dims, Plan
from attngen.runtime.plans import PlanCache

E4M3 = torch.float8_e4m3fn

DECODE = family("decode")
decode_launches = DECODE.launches()
# dense attention() calls go to the decode family with at most MAX_QUERY query tokens and at least
# MIN_KEYS keys, MIN_KEYS_PER_QUERY per query token
MIN_KEYS = 512
MIN_KEYS_PER_QUERY = 16


class DecodePlan(Plan):
    """The decode launches of one key. q (B, Sq, Hq, D); caches (B, S_max, Hkv, D) or paged."""

    FAMILY = DECODE
    ALIGNED = ("Q", "K", "V")

    def __init__(self, q, k_cache, v_cache, opts, cache_seqlens=None, block_table=None, new_len: int = 0,
                 num_splits: int = 0, out_layout: str = "bshd", descales=(None, None), new_kv=(None, None),
                 extra=None):
        B, sq, hq, dqk = q.shape
        hkv, dv = k_cache.shape[2], v_cache.shape[3]
        paged = block_table is not None
        capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
        self.opts, self.dtype = opts, q.dtype
        self.resolve(q, Dims(hq, hkv, dqk, dv, bucket_of(sq, capacity, B * hq)), opts, False)
        # a tuned winner was timed on both layouts of a bf16 / fp16 cache; an e4m3 cache's loop is
        # bound by instructions, not bytes, and keeps its own default unless a config is forced
        fp8_cache = k_cache.dtype == torch.float8_e4m3fn
        if self.config_source == "default" and paged or fp8_cache and self.config_source != "forced":
            self.config = fam_decode.layout_default(self.spec, self.device_class, paged, fp8_cache)
            self.config_source = "default (" + ", ".join(("paged",) * paged + ("e4m3 cache",) * fp8_cache) + ")"
        if num_splits:
            self.config = dataclasses.replace(self.config, num_splits=num_splits)
            self.config_source += " (num_splits given)"
        sms = sm_count(q.device)
        self.num_splits, self.split_len = fam_decode.splits(self.config, B, hkv, capacity, sms)
        block_m = fam_decode.rows_tile(hq // hkv, sq)
        self.part_shapes = fam_decode.partial_shapes(B, hkv, self.num_splits, block_m, dv)
        # the output as the caller holds it: (B, Sq, Hq, Dv), or (B, Hq, Sq, Dv) for a bhsd
        # attention() call (the kernel writes through its (B, Sq, Hq, Dv) view)
        self.out_layout = out_layout
        self.out_shape = (B, sq, hq, dv) if out_layout == "bshd" else (B, hq, sq, dv)
        self.lse_shape = (B, hq, sq)
        out, lse = self.empty()
        op, lp = self.partials()
        self.flags = kvguard.flags(q.device)
        self.compile(decode_launches(self.module, self.spec, q, k_cache, v_cache, self.out_view(out), lse, op, lp,
                                     opts.mask_args,
                                     self.config, self.num_splits, self.split_len, cache_seqlens, block_table,
                                     new_len, *descales, flags=self.flags, k_new=new_kv[0],
                                     v_new=new_kv[1], extra=extra))

    def empty(self):
        return (torch.empty(self.out_shape, dtype=self.dtype, device=self.device),
                torch.empty(self.lse_shape, dtype=torch.float32, device=self.device))

    def out_view(self, out):
        return out if self.out_layout == "bshd" else out.transpose(1, 2)

    def partials(self):
        if self.num_splits == 1:
            return None, None
        return (torch.empty(self.part_shapes[0], dtype=torch.float32, device=self.device),
                torch.empty(self.part_shapes[1], dtype=torch.float32, device=self.device))

    def run_cache(self, q, k_cache, v_cache, cache_seqlens=None, block_table=None, k_descale=None, v_descale=None,
                  k=None, v=None, extra=None):
        """(out in the plan's layout, lse (B, Hq, Sq)); k / v: the new tokens the plan appends first;
        extra: an expression call's parameters and sinks by kernel name."""
        out, lse = self.empty()
        op, lp = self.partials()
        self.launch({"Q": q, "K": k_cache, "V": v_cache, "Out": self.out_view(out), "Lse": lse, "OutP": op, "LseP": lp,
                     "CacheSeqlens": cache_seqlens, "BlockTable": block_table, "KDescale": k_descale,
                     "VDescale": v_descale, "Flags": self.flags, "KNew": k, "VNew": v, **(extra or {})})
        return out, lse


class DensePlan:
    """An attention() call with a short query on a long KV (bhsd or bshd), run by the decode family:
    the interface of api.ForwardPlan (run, empty, opts, spec, config, ...)."""

    def __init__(self, q, k, v, opts):
        self.layout, self.opts = opts.layout, opts
        qv, kv, vv = _bshd(q, k, v, opts.layout)
        self.plan = DecodePlan(qv, kv, vv, opts, out_layout=opts.layout)

    def __getattr__(self, name):  # spec, module, config, config_source, bucket, launches, empty, ...
        return getattr(self.__dict__["plan"], name)

    def run(self, q, k, v, cu_q=None, cu_k=None, want_lse=True):
        return self.plan.run_cache(*_bshd(q, k, v, self.layout))


def _bshd(q, k, v, layout: str):
    if layout == "bshd":
        return q, k, v
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def routes_to_decode(q, k, opts) -> bool:
    """Whether a validated dense call goes to the decode family: a short query on a long KV,
    causal alignment bottom-right (or no mask), and no forced forward config in scope."""
    if opts.layout == "packed" or "fwd" in dispatch._forced_configs or opts.expr is not None:
        return False
    sq, sk = (q.shape[1], k.shape[1]) if opts.layout == "bshd" else (q.shape[2], k.shape[2])
    if opts.top_left and opts.mask != "none":
        return False
    return 0 < sq <= fam_decode.MAX_QUERY and sk >= max(MIN_KEYS, MIN_KEYS_PER_QUERY * sq) and q.shape[0] > 0


_PLANS = PlanCache()


def _fail(msg: str):
    raise ValueError(msg)


def check_args(q, k_cache, v_cache, cache_seqlens, k, v, block_table, k_descale=None, v_descale=None) -> int:
    """Shape, dtype and device checks that need no device-to-host copy; returns new_len. The caches
    hold q's dtype, or e4m3 (an fp8 cache: k_descale / v_descale fp32 (B, Hkv) or None, 1.0).
    Values (cache_seqlens, block_table entries): kvguard.check_values, kvcache_impl."""
    doc = "(B, S, H, D) (paged caches: (num_pages, page_size, H, D))"
    dtype = validate.check_tensors({"q": q}, 4, doc)
    cache_dtype = validate.check_tensors({"k_cache": k_cache, "v_cache": v_cache}, 4, doc, dtypes=(dtype, E4M3))
    if k_cache.device != q.device:
        _fail(f"k_cache: on {k_cache.device}, but q is on {q.device}")
    B, sq, hq, d = q.shape
    _, s_c, hkv, dk = k_cache.shape
    for name, ds in (("k_descale", k_descale), ("v_descale", v_descale)):
        if ds is None:
            continue
        if cache_dtype != E4M3:
            _fail(f"{name}: only for float8_e4m3fn caches (the caches are {cache_dtype})")
        if not isinstance(ds, torch.Tensor) or ds.dtype != torch.float32:
            _fail(f"{name}: expected an fp32 torch.Tensor ({B}, {hkv}), got "
                  f"{ds.dtype if isinstance(ds, torch.Tensor) else type(ds).__name__}")
        if tuple(ds.shape) != (B, hkv):
            _fail(f"{name}: expected shape ({B}, {hkv}) (batch, KV heads), got {tuple(ds.shape)}")
        if ds.device != q.device:
            _fail(f"{name}: on {ds.device}, but q is on {q.device}")
    if v_cache.shape[:3] != k_cache.shape[:3]:
        _fail(f"v_cache: shape {tuple(v_cache.shape)} differs from k_cache's {tuple(k_cache.shape)} before the head dim")
    validate.check_heads(hq, hkv, v_cache.shape[2], d, dk, v_cache.shape[3])
    if not 1 <= sq <= fam_decode.MAX_QUERY:
        _fail(f"q: {sq} query tokens; attention_with_kvcache takes 1 to {fam_decode.MAX_QUERY} (use attention() "
              "for longer queries)")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            _fail(f"{name}: the head dim must be contiguous (stride 1), got strides {t.stride()}")
    if block_table is not None:
        if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32:
            _fail("block_table: expected an int32 torch.Tensor (B, max_pages)")
        if block_table.dim() != 2 or block_table.shape[0] != B:
            _fail(f"block_table: expected shape ({B}, max_pages), got {tuple(block_table.shape)}")
        if block_table.device != q.device:
            _fail(f"block_table: on {block_table.device}, but q is on {q.device}")
        if s_c % 16:
            _fail(f"k_cache: page size {s_c} is not a multiple of 16")
        if k_cache.shape[0] == 0:
            _fail("k_cache: a paged cache needs at least one page (num_pages is 0)")
        capacity = block_table.shape[1] * s_c
    else:
        if k_cache.shape[0] != B:
            _fail(f"k_cache: batch {k_cache.shape[0]} differs from q's {B} (a paged cache needs block_table)")
        capacity = s_c
    if capacity > MAX_SEQLEN:
        _fail(f"k_cache: {capacity} keys per row is above the kernels' maximum {MAX_SEQLEN}")
    new_len = 0
    if (k is None) != (v is None):
        _fail("k, v: pass both new keys and new values, or neither")
    if k is not None:
        if cache_seqlens is None:
            _fail("cache_seqlens: required with new k / v (where to write them)")
        for name, t, dd in (("k", k, dk), ("v", v, v_cache.shape[3])):
            if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.device != q.device:
                _fail(f"{name}: expected a {dtype} tensor on {q.device}")
            if t.dim() != 4 or t.shape[0] != B or t.shape[2] != hkv or t.shape[3] != dd:
                _fail(f"{name}: expected shape ({B}, new tokens, {hkv}, {dd}), got {tuple(t.shape)}")
        if k.shape[1] != v.shape[1]:
            _fail(f"v: {v.shape[1]} new tokens, k has {k.shape[1]}")
        new_len = k.shape[1]
        if new_len > capacity:
            _fail(f"k: {new_len} new tokens do not fit a cache row of {capacity}")
    if cache_seqlens is not None:
        if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32:
            _fail("cache_seqlens: expected an int32 torch.Tensor (B,)")
        if cache_seqlens.shape != (B,):
            _fail(f"cache_seqlens: expected shape ({B},), got {tuple(cache_seqlens.shape)}")
        if cache_seqlens.device != q.device:
            _fail(f"cache_seqlens: on {cache_seqlens.device}, but q is on {q.device}")
    elif block_table is not None:
        _fail("cache_seqlens: required with a paged cache (block_table)")
    return new_len


def kvcache_impl(q, k_cache, v_cache, cache_seqlens, k, v, block_table, opts, new_len: int, num_splits: int = 0,
                 k_descale=None, v_descale=None, validate: bool = False, extra=None):
    """(out, lse) of a checked call; the body of the custom op. The metadata's values are checked
    on the host (kvguard.check_values) when they are there already (CPU tensors) or `validate`
    asks (a device-to-host copy; skipped while a CUDA graph is captured); the kernels bound every
    access and flag the rest (kvguard.flags)."""
    if cache_seqlens is not None and (cache_seqlens.device.type == "cpu" or validate and not
                                      kvguard.capturing(cache_seqlens.device)):
        paged = block_table is not None
        capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
        kvguard.check_values(cache_seqlens, block_table, new_len, capacity, k_cache.shape[0] if paged else 0,
                             k_cache.shape[1])
    descales = (None if k_descale is None else k_descale.stride(), None if v_descale is None else v_descale.stride())
    key = (q.shape, q.stride(), k_cache.shape, k_cache.stride(), v_cache.shape, v_cache.stride(), q.dtype,
           k_cache.dtype, q.device, opts, cache_seqlens is None, None if block_table is None else (block_table.shape,
           block_table.stride()), new_len, None if k is None else (k.stride(), v.stride()), num_splits, descales,
           dispatch.override(), None if not extra else tuple((n, t.shape, t.stride(), t.dtype)
                                                              for n, t in sorted(extra.items())))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS.put(key, DecodePlan(q, k_cache, v_cache, opts, cache_seqlens, block_table, new_len,
                                          num_splits, descales=(k_descale, v_descale), new_kv=(k, v), extra=extra))
    return plan.run_cache(q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, k, v, extra)
