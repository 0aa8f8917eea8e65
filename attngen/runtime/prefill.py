"""Chunked prefill on a paged KV cache: `attngen.attention_varlen(..., block_table=...)` and the
prefill_paged family's plan.

Packed queries (total_q, Hq, D) of any length per sequence, as flash-attn's varlen call takes
them, against K / V in pages (num_pages, page_size, Hkv, D) found through an int32 block table
(B, max_pages): what vLLM and SGLang call for chunked prefill. Sequence b's keys are its first
seqused_k[b] positions (else cu_seqlens_k[b + 1] - cu_seqlens_k[b]); causal masks and windows are
bottom-right per sequence. Inference only.

Metadata: cu_seqlens_q addresses q and the output, so its values are checked on the host (once
per tensor and version, as attention_varlen checks cu_seqlens). The key counts and the table are
bounded in the kernel and flagged (attngen.runtime.kvguard, attngen.check_kvcache()); on the CPU,
or with ATTNGEN_CHECK_KVCACHE=1, they are checked on the host before the launch too.
"""

from __future__ import annotations

import torch

from attngen import env
from attngen.buckets import bucket_of
from attngen.families import family
from attngen.kernels.common import MAX_SEQLEN
from attngen.runtime import dispatch, kvguard, validate
from attngen.runtime.api import extra_key
from attngen.runtime.plan import Dims, Plan
from attngen.runtime.plans import PlanCache

PREFILL = family("prefill_paged")
prefill_launches = PREFILL.launches()
SHAPES = "(num_pages, page_size, Hkv, D) (a paged cache, with block_table)"


def _fail(msg: str):
    raise ValueError(msg)


def _int_tensor(name: str, t, shape: tuple, device, doc: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
        _fail(f"{name}: expected an int32 torch.Tensor {doc}")
    if tuple(t.shape) != shape:
        _fail(f"{name}: expected shape {shape} {doc}, got {tuple(t.shape)}")
    if t.device != device:
        _fail(f"{name}: on {t.device}, but q is on {device}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        _fail(f"{name}: its last dim must be contiguous (stride 1), got strides {t.stride()}")


def check_args(q, k, v, cu_q, cu_k, max_q, max_k, block_table, seqused_k) -> None:
    """Shapes, dtypes, devices and sizes: everything that needs no value of a tensor."""
    dtype = validate.check_tensors({"q": q}, 3, "(total_q, Hq, D)")
    validate.check_tensors({"k": k, "v": v}, 4, SHAPES, dtypes=(dtype,))
    if k.device != q.device:
        _fail(f"k: on {k.device}, but q is on {q.device}")
    total_q, hq, d = q.shape
    num_pages, page_size, hkv, dk = k.shape
    if v.shape[:3] != k.shape[:3]:
        _fail(f"v: shape {tuple(v.shape)} differs from k's {tuple(k.shape)} before the head dim")
    validate.check_heads(hq, hkv, v.shape[2], d, dk, v.shape[3])
    if page_size == 0 or page_size % 16:
        _fail(f"k: page size {page_size} (k.shape[1]) is not a multiple of 16; the paged kernels read 16 keys "
              "of one page at a time")
    if num_pages == 0:
        _fail("k: a paged cache needs at least one page (num_pages is 0)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            _fail(f"{name}: the head dim must be contiguous (stride 1), got strides {t.stride()}")
    validate._cu_metadata("cu_seqlens_q", cu_q)
    seqs = cu_q.numel() - 1
    _int_tensor("cu_seqlens_q", cu_q, (seqs + 1,), q.device, "(one entry per sequence, and one)")
    if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2:
        _fail(f"block_table: expected an int32 torch.Tensor ({seqs}, max_pages)")
    _int_tensor("block_table", block_table, (seqs, block_table.shape[1]), q.device,
                "(one row per sequence of cu_seqlens_q)")
    if block_table.shape[1] * page_size > MAX_SEQLEN:
        _fail(f"block_table: {block_table.shape[1]} pages of {page_size} keys is above the kernels' longest "
              f"sequence {MAX_SEQLEN}")
    if seqused_k is not None:
        _int_tensor("seqused_k", seqused_k, (seqs,), q.device, "(keys of each sequence)")
    elif cu_k is None:
        _fail("cu_seqlens_k: required when seqused_k is not given (the key count of each sequence)")
    if cu_k is not None:
        validate._cu_metadata("cu_seqlens_k", cu_k)
        _int_tensor("cu_seqlens_k", cu_k, (seqs + 1,), q.device, "(as many sequences as cu_seqlens_q)")
    for name, mx in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if not isinstance(mx, int) or isinstance(mx, bool) or mx < 0:
            _fail(f"{name}: must be an int >= 0, got {mx!r}")
        if mx > MAX_SEQLEN:
            _fail(f"{name}: {mx} is above the kernels' longest sequence {MAX_SEQLEN}")


def check_cu_q(cu_q, total_q: int, max_q: int, device) -> None:
    """cu_seqlens_q's values (a device-to-host copy, once per tensor and version): on q's device,
    starts at 0, ends at total_q, non-decreasing, no chunk longer than max_seqlen_q."""
    key = (id(cu_q), cu_q._version, total_q, max_q)
    if getattr(cu_q, "_attngen_paged_checked", None) == key:
        return
    host = cu_q.cpu()
    validate.check_cu_seqlens("cu_seqlens_q", cu_q, host, total_q, device)
    lens = host[1:] - host[:-1]
    if lens.numel() and int(lens.max()) > max_q:
        _fail(f"max_seqlen_q: {max_q} is below the longest chunk of queries ({int(lens.max())})")
    cu_q._attngen_paged_checked = key


class PrefillPagedPlan(Plan):
    """The prefill_paged launch of one key: q (total_q, Hq, D), paged k / v, the block table."""

    FAMILY = PREFILL
    ALIGNED = ("Q", "K", "V")

    def __init__(self, q, k, v, opts, cu_q, cu_k, seqused_k, block_table, max_q: int, max_k: int, extra=None):
        total_q, hq, dqk = q.shape
        hkv, dv = k.shape[2], v.shape[3]
        seqs = cu_q.numel() - 1
        self.opts, self.dtype = opts, q.dtype
        # the bucket of the longest chunk (at least 2: Sq = 1 is the decode family's bucket)
        self.resolve(q, Dims(hq, hkv, dqk, dv, bucket_of(max(max_q, 2), max(max_k, 1), max(seqs, 1) * hq)),
                     opts, False)
        self.out_shape, self.lse_shape = (total_q, hq, dv), (hq, total_q)
        self.flags = kvguard.flags(q.device)
        out, lse = self.empty()
        self.compile(prefill_launches(self.module, self.spec, q, k, v, out, lse, cu_q, cu_k, seqused_k, block_table,
                                      max_q, opts.mask_args, self.config, self.flags, extra=extra))

    def empty(self):
        return (torch.empty(self.out_shape, dtype=self.dtype, device=self.device),
                torch.empty(self.lse_shape, dtype=torch.float32, device=self.device))

    def run(self, q, k, v, cu_q, cu_k, seqused_k, block_table, extra=None):
        out, lse = self.empty()
        self.launch({"Q": q, "K": k, "V": v, "Out": out, "Lse": lse, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k,
                     "SequsedK": seqused_k, "BlockTable": block_table, "Flags": self.flags, **(extra or {})})
        return out, lse


_PLANS = PlanCache()


def prefill_impl(q, k, v, cu_q, cu_k, max_q: int, max_k: int, block_table, seqused_k, opts,
                 validate_values: bool = False, extra=None):
    """(out, lse) of a checked call; the body of the custom op. cu_seqlens_q's values are checked
    on the host; the key counts and the table when they are there already (CPU tensors) or
    `validate_values` asks (a device-to-host copy; skipped while a CUDA graph is captured)."""
    check_cu_q(cu_q, q.shape[0], max_q, q.device)
    if q.device.type == "cpu" or validate_values and not kvguard.capturing(q.device):
        kvguard.check_prefill_values(seqused_k, cu_k, block_table, k.shape[0], k.shape[1])
    key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, q.device, opts, cu_q.shape,
           cu_k is None, seqused_k is None, block_table.shape, block_table.stride(), max_q, max_k,
           dispatch.override(), extra_key(extra))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS.put(key, PrefillPagedPlan(q, k, v, opts, cu_q, cu_k, seqused_k, block_table, max_q, max_k,
                                                extra))
    return plan.run(q, k, v, cu_q, cu_k, seqused_k, block_table, extra)


# the attention_varlen options the paged call does not take, and why
_NOT_PAGED = {"precision": "the fp8 kernels read packed k / v", "variant": "no spec variants yet; give the "
              "variant's expressions as mask_mod / score_mod"}


def prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table, seqused_k, causal,
            window_size, softcap, scale, causal_alignment, unsupported: dict):
    """The checks of attention_varlen with a block table (attngen.runtime.public, which then runs
    the custom op under torch.compile, else prefill_impl): (options, whether to check the key
    counts and the table on the host). unsupported: the call's values of _NOT_PAGED's options."""
    for name, value in unsupported.items():
        if value is not None and value is not False and value != {}:
            _fail(f"{name}: not supported with block_table (the paged prefill kernels: {_NOT_PAGED[name]})")
    if block_table is None:
        _fail("seqused_k: only with block_table (a paged KV cache); packed k / v take cu_seqlens_k alone")
    check_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table, seqused_k)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        _fail("block_table: attention_varlen on a paged KV cache is inference only (no gradient); call it under "
              "torch.no_grad(), or pass packed k / v without block_table for training")
    opts = validate.make_options(q.shape[-1], causal, window_size, softcap, scale, causal_alignment, "packed")
    return opts, env.check_kvcache()
