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
import math

import torch

from attngen.buckets import bucket_of
from attngen.families import decode as fam_decode
from attngen.families import family
from attngen.kernels.common import MAX_SEQLEN
from attngen.kernels.launch import _hooks_off, _stream, sm_count
from attngen.runtime import dispatch, kvguard, validate
from attngen.runtime.plan import Dims, Plan
from attngen.runtime.plans import PlanCache, aligned

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
    # the new tokens and rotary tables too: a kernel compiled for 16-byte aligned bases may read
    # them vectorized (a later call with a misaligned slice runs the JIT path instead)
    ALIGNED = ("Q", "K", "V", "KNew", "VNew", "RotaryCos", "RotarySin")

    def __init__(self, q, k_cache, v_cache, opts, cache_seqlens=None, block_table=None, new_len: int = 0,
                 num_splits: int = 0, out_layout: str = "bshd", descales=(None, None), new_kv=(None, None),
                 extra=None, indices=(None, None), rotary=None):
        """indices: (cache_batch_idx, cache_leftpad); rotary: a families.decode.Rotary or None."""
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
        # the split partials (and an unwanted logsumexp) in one allocation once every launch
        # replays through the raw launcher: byte offsets, 256-byte aligned (run_cache)
        sizes = [0 if self.num_splits == 1 else 4 * math.prod(sh) for sh in self.part_shapes]
        sizes.append(4 * math.prod(self.lse_shape))
        offs = [0]
        for n in sizes:
            offs.append(offs[-1] + -(-n // 256) * 256)
        self.scratch_offsets, self.raw = tuple(offs), False
        self.scratch = None  # that allocation, kept for calls on the legacy default stream (run_cache)
        # a split call merged in the split kernel (families.decode.fused_merge): its per-row
        # counters of finished slices, one tensor per stream (counter())
        self.fused = fam_decode.fused_merge(self.config, self.num_splits)
        self.counter_len = B * hkv
        self.counters: dict = {}
        out, lse = self.empty()
        op, lp = self.partials()
        self.flags = kvguard.flags(q.device)
        self.compile(decode_launches(self.module, self.spec, q, k_cache, v_cache, self.out_view(out), lse, op, lp,
                                     opts.mask_args,
                                     self.config, self.num_splits, self.split_len, cache_seqlens, block_table,
                                     new_len, *descales, flags=self.flags, k_new=new_kv[0],
                                     v_new=new_kv[1], extra=extra, cache_batch_idx=indices[0],
                                     cache_leftpad=indices[1], rotary=rotary, counter=self.counter()))

    def counter(self):
        """The int32 (B x Hkv,) counters of a fused call (None otherwise), which each call's kernel
        leaves at zero. Calls on one stream run in order, so they share one; two streams replaying
        the plan at once must not, so each stream has its own. While a CUDA graph is captured, a
        fresh one (its zeroing is captured with the call): the graph may replay on any stream,
        beside eager calls on its capture stream."""
        if not self.fused:
            return None
        if self.device.type != "cuda":
            stream = None
        elif torch.cuda.is_current_stream_capturing():
            return torch.zeros(self.counter_len, dtype=torch.int32, device=self.device)
        else:
            stream = _stream(self.device.index)
        c = self.counters.get(stream)
        if c is None:
            c = self.counters[stream] = torch.zeros(self.counter_len, dtype=torch.int32, device=self.device)
        return c

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
                  k=None, v=None, extra=None, indices=(None, None), rotary=None, want_lse: bool = True):
        """(out in the plan's layout, lse (B, Hq, Sq), or None when not want_lse); k / v: the new
        tokens the plan appends first; extra: an expression call's parameters and sinks by kernel
        name; indices (cache_batch_idx, cache_leftpad) and rotary (families.decode.Rotary) as the
        plan was built with. Once every launch replays through the raw launcher, the split
        partials (and an unwanted logsumexp) go as addresses in one allocation: four allocations
        a call cost more host time than the two launches' argument lists. On the legacy default
        stream that allocation is the plan's own, made once (calls there run in order)."""
        out = torch.empty(self.out_shape, dtype=self.dtype, device=self.device)
        cos, sin = (rotary.cos, rotary.sin) if rotary else (None, None)
        # the addresses only where every launch takes the raw launcher (Triton's own takes tensors)
        ok = aligned(q, k_cache, v_cache, k, v, cos, sin)
        if self.raw and ok and _hooks_off():
            offs = self.scratch_offsets
            size = offs[-1] if not want_lse else offs[2]
            # on the legacy default stream the plan's own buffer, ordered after the last call's
            # kernels that read it; on another (a CUDA graph's capture among them) the caching
            # allocator's, held until the launches are queued
            flat = None
            if not size:
                base = 0
            elif _stream(self.device.index) == 0:
                if self.scratch is None:
                    self.scratch = torch.empty(offs[-1], dtype=torch.uint8, device=self.device)
                base = self.scratch.data_ptr()
            else:
                flat = torch.empty(size, dtype=torch.uint8, device=self.device)
                base = flat.data_ptr()
            op, lp = (None, None) if self.num_splits == 1 else (base + offs[0], base + offs[1])
            lse = (torch.empty(self.lse_shape, dtype=torch.float32, device=self.device) if want_lse
                   else base + offs[2])
        else:
            lse = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device)
            op, lp = self.partials()
        tensors = {"Q": q, "K": k_cache, "V": v_cache, "Out": self.out_view(out), "Lse": lse, "OutP": op, "LseP": lp,
                   "CacheSeqlens": cache_seqlens, "BlockTable": block_table, "KDescale": k_descale,
                   "VDescale": v_descale, "Flags": self.flags, "KNew": k, "VNew": v, "CacheBatchIdx": indices[0],
                   "CacheLeftpad": indices[1], "RotaryCos": cos, "RotarySin": sin,
                   "Counter": self.counter() if self.fused else None, **(extra or {})}
        for launch in self.launches:  # no TMA descriptor in the decode kernels (Plan.launch's check)
            launch(tensors, ok)
        if not self.raw:
            self.raw = all(la.ready for la in self.launches) and not self.tma
        return out, (lse if want_lse else None)


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
        return self.plan.run_cache(*_bshd(q, k, v, self.layout), want_lse=want_lse)


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
# attention_with_kvcache's own argument key -> (DecodePlan, new_len, rotary per token): its eager
# fast path (public.attention_with_kvcache)
_FAST = PlanCache()


def _fail(msg: str):
    raise ValueError(msg)


def check_args(q, k_cache, v_cache, cache_seqlens, k, v, block_table, k_descale=None, v_descale=None,
               cache_batch_idx=None, cache_leftpad=None, rotary_cos=None, rotary_sin=None,
               rotary_interleaved=True) -> int:
    """Shape, dtype and device checks that need no device-to-host copy; returns new_len. The caches
    hold q's dtype, or e4m3 (an fp8 cache: k_descale / v_descale fp32 (B, Hkv) or None, 1.0).
    cache_batch_idx / cache_leftpad: int32 (B,), dense caches only; rotary_cos / rotary_sin
    (seqlen_ro, rotary_dim / 2), with new k / v (check_rotary). Values (cache_seqlens, block_table,
    cache_batch_idx, cache_leftpad entries): kvguard.check_values, kvcache_impl."""
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
    if cache_batch_idx is not None or cache_leftpad is not None:
        for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
            _check_rows_vector(name, t, B, q.device)
            if t is not None and block_table is not None:
                _fail(f"{name}: not with a paged cache (block_table), as flash-attn")
    if block_table is not None:
        if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32:
            _fail("block_table: expected an int32 torch.Tensor (B, max_pages)")
        if block_table.dim() != 2 or block_table.shape[0] != B:
            _fail(f"block_table: expected shape ({B}, max_pages), got {tuple(block_table.shape)}")
        if block_table.device != q.device:
            _fail(f"block_table: on {block_table.device}, but q is on {q.device}")
        if block_table.shape[1] > 1 and block_table.stride(1) != 1:  # the kernels step rows only
            _fail(f"block_table: its entries must be contiguous within a row (stride 1), got strides "
                  f"{block_table.stride()}")
        if s_c % 16:
            _fail(f"k_cache: page size {s_c} is not a multiple of 16")
        if k_cache.shape[0] == 0:
            _fail("k_cache: a paged cache needs at least one page (num_pages is 0)")
        capacity = block_table.shape[1] * s_c
    else:
        if cache_batch_idx is None and k_cache.shape[0] != B:
            _fail(f"k_cache: batch {k_cache.shape[0]} differs from q's {B} (a paged cache needs block_table, "
                  "other cache rows cache_batch_idx)")
        if cache_batch_idx is not None and k_cache.shape[0] == 0:
            _fail("k_cache: no rows for cache_batch_idx to name")
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
    _check_rows_vector("cache_seqlens", cache_seqlens, B, q.device)
    if cache_seqlens is None and block_table is not None:
        _fail("cache_seqlens: required with a paged cache (block_table)")
    if rotary_cos is not None or rotary_sin is not None:
        check_rotary(q, rotary_cos, rotary_sin, rotary_interleaved, k is not None, new_len, capacity)
    return new_len


def _check_rows_vector(name: str, t, B: int, device) -> None:
    """An int32 (B,) tensor on q's device (one value per batch row), or None."""
    if t is None:
        return
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
        _fail(f"{name}: expected an int32 torch.Tensor (B,)")
    if t.shape != (B,):
        _fail(f"{name}: expected shape ({B},), got {tuple(t.shape)}")
    if t.device != device:
        _fail(f"{name}: on {t.device}, but q is on {device}")
    if B > 1 and t.stride(0) != 1:  # the kernels read entry b at the base + b
        _fail(f"{name}: must be contiguous (stride 1), got stride {t.stride(0)}")


def check_rotary(q, cos, sin, interleaved, new_kv: bool, new_len: int, capacity: int) -> None:
    """rotary_cos / rotary_sin (either given): both, with new k / v (flash-attn's rule: the positions
    start at cache_seqlens, where the new keys go), (seqlen_ro, rotary_dim / 2) of q's dtype or
    fp32, rotary_dim at most the head dim, the last dim contiguous, the same strides, and positions
    for every query token (families.decode.check_layout_args)."""
    if cos is None or sin is None:
        _fail(f"{'rotary_cos' if cos is None else 'rotary_sin'}: pass rotary_cos and rotary_sin together")
    if not isinstance(interleaved, bool):
        _fail(f"rotary_interleaved: must be a bool, got {interleaved!r}")
    if not new_kv:
        _fail("rotary_cos: needs new k / v (as flash-attn: q and the new keys are rotated from cache_seqlens on)")
    d = q.shape[3]
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        if not isinstance(t, torch.Tensor) or t.dtype not in (q.dtype, torch.float32):
            _fail(f"{name}: expected a {q.dtype} or torch.float32 tensor (seqlen_ro, rotary_dim / 2)")
        if t.dim() != 2 or not 1 <= 2 * t.shape[1] <= d:
            _fail(f"{name}: expected shape (seqlen_ro, rotary_dim / 2) with rotary_dim from 2 to the head dim "
                  f"{d}, got {tuple(t.shape)}")
        if t.device != q.device:
            _fail(f"{name}: on {t.device}, but q is on {q.device}")
        if t.shape[1] > 1 and t.stride(1) != 1:
            _fail(f"{name}: the last dim must be contiguous (stride 1), got strides {t.stride()}")
    if sin.dtype != cos.dtype or sin.shape != cos.shape or sin.stride(0) != cos.stride(0):
        _fail(f"rotary_sin: {sin.dtype} {tuple(sin.shape)} strides {sin.stride()} differ from rotary_cos's "
              f"{cos.dtype} {tuple(cos.shape)} {cos.stride()}")
    need = capacity + max(0, q.shape[1] - new_len)
    if cos.shape[0] < need:
        _fail(f"rotary_cos: {cos.shape[0]} positions, fewer than the {need} a call can reach (a row's capacity "
              f"{capacity}" + (f" + {q.shape[1] - new_len} query tokens past the new keys)" if need > capacity else ")"))


def kvcache_impl(q, k_cache, v_cache, cache_seqlens, k, v, block_table, opts, new_len: int, num_splits: int = 0,
                 k_descale=None, v_descale=None, validate: bool = False, extra=None, indices=(None, None),
                 rotary=None, keep=None):
    """(out, lse) of a checked call; the body of the custom op. indices: (cache_batch_idx,
    cache_leftpad); rotary: a families.decode.Rotary or None. The metadata's values are checked on
    the host (kvguard.check_values) when they are there already (CPU tensors) or `validate` asks
    (a device-to-host copy; skipped while a CUDA graph is captured); the kernels bound every access
    and flag the rest (kvguard.flags). keep: (a PlanCache, a key) under which the plan is kept
    too (attention_with_kvcache's fast path, keyed on its own arguments)."""
    check_meta(q, k_cache, cache_seqlens, block_table, new_len, validate, indices)
    descales = (None if k_descale is None else k_descale.stride(), None if v_descale is None else v_descale.stride())
    key = (q.shape, q.stride(), k_cache.shape, k_cache.stride(), v_cache.shape, v_cache.stride(), q.dtype,
           k_cache.dtype, q.device, opts, cache_seqlens is None, None if block_table is None else (block_table.shape,
           block_table.stride()), new_len, None if k is None else (k.stride(), v.stride()), num_splits, descales,
           dispatch.override(), None if not extra else tuple((n, t.shape, t.stride(), t.dtype)
                                                              for n, t in sorted(extra.items())),
           indices[0] is None, indices[1] is None,
           None if rotary is None else (rotary.cos.shape[1], rotary.cos.stride(0), rotary.cos.dtype,
                                        rotary.interleaved, rotary.per_token))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS.put(key, DecodePlan(q, k_cache, v_cache, opts, cache_seqlens, block_table, new_len,
                                          num_splits, descales=(k_descale, v_descale), new_kv=(k, v), extra=extra,
                                          indices=indices, rotary=rotary))
    if keep is not None:
        keep[0].put(keep[1], (plan, new_len, rotary is not None and rotary.per_token))
    return plan.run_cache(q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, k, v, extra,
                          indices, rotary)


def check_meta(q, k_cache, cache_seqlens, block_table, new_len: int, validate: bool, indices) -> None:
    """The host check of a call's metadata values where it runs (kvcache_impl's doc)."""
    meta = cache_seqlens if cache_seqlens is not None else indices[0] if indices[0] is not None else indices[1]
    if meta is not None and (meta.device.type == "cpu" or validate and not kvguard.capturing(meta.device)):
        paged = block_table is not None
        capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
        kvguard.check_values(cache_seqlens, block_table, new_len, capacity, k_cache.shape[0] if paged else 0,
                             k_cache.shape[1], *indices, k_cache.shape[0])
