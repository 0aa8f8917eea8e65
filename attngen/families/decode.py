"""The decode family (`decode`, templates/attn_decode.py.jinja): split-KV attention of a short
query (1 to 16 tokens) on a long KV cache, contiguous or paged. Its launch config, validity
filter, search space, defaults, how a call is split, its launches, and its Family record.

A program takes one slice of the keys of one KV head for all gqa_ratio x Sq query rows of that
head (GQA packing: the cache is read once per group), writes a partial output with its LSE, and a
combine launch merges the slices (LSE-weighted). The number of slices comes from shapes only --
batch, KV heads, the cache's capacity and the GPU's SM count -- never from cache_seqlens values,
so a call needs no device-to-host copy and can be captured in a CUDA graph.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

from attngen.families.base import Family, _pow2, require_valid
from attngen.kernels.launch import expr_values, Launch, pdl, programs
from attngen.spec import KernelSpec

MAX_QUERY = 16  # query tokens per call (speculative decoding drafts included)
MAX_SPLITS = 128
MIN_SPLIT_KEYS = 256  # a slice shorter than this costs more in its partial write than it saves
PROGRAMS_PER_SM = 2  # splits() aims at this many programs per SM
# the slots of the int32 flag tensor the kernels write (row + 1) when a call's metadata is out of
# range (attngen.runtime.kvguard reads them): kv_len past the capacity or cache_seqlens < 0; a
# used block-table entry outside [0, num_pages); a new token not written (no room, or its page); a
# cache_batch_idx outside the cache's rows; a cache_leftpad outside [0, cache_seqlens]
FLAG_SLOTS = {"FLAG_SEQLENS": 0, "FLAG_TABLE": 1, "FLAG_APPEND": 2, "FLAG_BATCH_IDX": 3, "FLAG_LEFTPAD": 4}
NUM_FLAGS = 8


@dataclass(frozen=True)
class DecodeConfig:
    block_n: int  # keys per step of a program's loop
    num_warps: int
    num_stages: int
    # slices of the key axis per (batch row, KV head): 0 = from shapes (splits()), else this many
    # (fewer when the cache is shorter than num_splits x block_n)
    num_splits: int = 0
    # how a split call merges its slices: "launch" (the combine kernel, a second launch) or
    # "fused" (the row's last slice to finish merges them in the split kernel, a counter per row;
    # MERGES says where each won)
    merge: str = "launch"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class Rotary(NamedTuple):
    """A call's fused rotary embedding (flash-attn's rotary_cos / rotary_sin): cos / sin
    (seqlen_ro, rotary_dim / 2) tensors; interleaved: pairs (2i, 2i + 1), else (i, i + rotary_dim /
    2); per_token: query token i sits at position cache_seqlens + i (a causal or local call), else
    every query token at cache_seqlens."""

    cos: Any
    sin: Any
    interleaved: bool
    per_token: bool


def check_decode(spec: KernelSpec, cfg: DecodeConfig) -> str | None:
    """None if `cfg` can launch `spec`'s decode kernels, else the reason (the tuner records it)."""
    if spec.varlen:
        return "decode kernels read a KV cache, not packed documents"
    if not _pow2(cfg.block_n) or not 16 <= cfg.block_n <= 256:
        return "block_n must be a power of two from 16 to 256"
    if cfg.num_warps not in (1, 2, 4, 8):
        return "num_warps must be 1, 2, 4 or 8"
    if cfg.num_stages < 1:
        return "num_stages must be >= 1"
    if not 0 <= cfg.num_splits <= MAX_SPLITS:
        return f"num_splits is 0 (from shapes) or 1 to {MAX_SPLITS}"
    if cfg.merge not in MERGES:
        return f"merge is one of {', '.join(MERGES)}, got {cfg.merge!r}"
    # K and V tiles per stage, 2-byte elements; the query tile stays in registers
    d = _pad(spec.head_dim_qk) + _pad(spec.head_dim_v)
    need = 2 * cfg.num_stages * cfg.block_n * d
    if need > 160 * 1024:
        return f"needs ~{need} B of shared memory"
    return None


MERGES = ("launch", "fused")
# Neither form wins every row, on either machine, so the default is the combine launch and the
# tuner picks per bucket ("merge" in SPACE). do_bench µs a call, both forms alternated in one
# process:
# - H100, default configs (session 56, benchmarks/ab/h100_ab_decode_merge_2026-12-07.json, three
#   rounds): fused faster at 16 slices (B1 KV4k GQA 32/8, 23.1-23.6 -> 22.2-22.8) and 32 (B1 KV32k
#   74.6-74.9 -> 71.6-71.7, B1 KV128k 206.4-206.8 -> 202.9-203.1), even at 9 (MHA B1 KV32k), 10 %
#   slower at 5 (B8 KV32k GQA 32/8, 390.7-391.2 -> 432.3-432.5);
# - H200, the shipped (H100-tuned) configs, every decode bench row (session 61,
#   benchmarks/ab/h200_ab_decode_merge_2026-12-07.json, two rounds): fused 6 % faster at B8 KV32k
#   GQA 32/8 (8 slices, 279.4 -> 262.2-262.9) and 7 % at B8 KV8k MHA (2 slices, 281.7-282.6 ->
#   261.9-263.0); 1 % slower at B1 KV128k (33), MHA B1 KV32k (8) and hd64 B8 KV32k (5); even at
#   B1 KV32k (32) and where there is one slice.


def fused_merge(cfg: DecodeConfig, num_splits: int) -> bool:
    """Whether a call of `num_splits` slices (splits()) merges them in the split kernel."""
    return num_splits > 1 and cfg.merge == "fused"


def _pad(d: int) -> int:
    return max(16, 1 << (d - 1).bit_length())


def rows_tile(gqa: int, seqlen_q: int) -> int:
    """BLOCK_M: the packed query rows of one KV head (gqa x Sq), a power of two, at least 16."""
    return max(16, 1 << (gqa * seqlen_q - 1).bit_length())


def splits(cfg: DecodeConfig, batch: int, kv_heads: int, capacity: int, sms: int) -> tuple[int, int]:
    """(num_splits, split_len) of a call: shapes only. `capacity`: the most keys a row can hold
    (the cache's S_max, or max pages x page size). From shapes: PROGRAMS_PER_SM programs per SM,
    no slice under MIN_SPLIT_KEYS keys; split_len a multiple of block_n."""
    target = PROGRAMS_PER_SM * sms
    capacity = max(capacity, 1)
    if cfg.num_splits:
        n = cfg.num_splits
    else:
        programs = max(batch * kv_heads, 1)
        n = min(-(-target // programs), -(-capacity // MIN_SPLIT_KEYS), MAX_SPLITS)
    n = max(1, min(n, -(-capacity // cfg.block_n)))
    split_len = -(-(-(-capacity // n)) // cfg.block_n) * cfg.block_n
    return -(-capacity // split_len), split_len


SPACE: dict[str, tuple] = {
    "block_n": (32, 64, 128),
    "num_warps": (2, 4, 8),
    "num_stages": (1, 2, 3, 4),
    # 0: splits() from shapes (two programs per SM). 64 splits (four programs per SM at B1 GQA 32/8)
    # was in the space for one H100 tune run and lost every trial: B1 KV128k 2252-2546 GB/s against
    # 2712, KV32k 1338-1497 against 1930, the MHA and hd64 buckets likewise
    # (benchmarks/results/h100_tune_decode_mha_hd64_2026-12-07.log). 16 (one program per SM at B1
    # GQA 32/8, two at B1 MHA's 32 rows / 4) joined in session 60, not yet tuned with: the B1 rows
    # are the decode rows furthest from SDPA's cuDNN backend (0.87 / 0.94), and no count between
    # 8 and 32 had been tried there
    "num_splits": (0, 1, 8, 16, 32),
    # the merge inside the split kernel (session 61; MERGES)
    "merge": ("launch", "fused"),
}


def default_decode_config(spec: KernelSpec, device_kind: str = "cuda") -> DecodeConfig:
    """The family's default for a contiguous bf16 / fp16 cache (layout_default: paged and e4m3)."""
    if device_kind == "cpu":
        return DecodeConfig(32, 4, 1)
    width = max(spec.head_dim_qk, spec.head_dim_v)
    if width > 128:
        return DecodeConfig(32, 4, 2)
    if width <= 64:
        return NARROW_DECODE_DEFAULT
    # the best geometric mean of a config sweep on the H200 (hd128, GQA 32/8: B1 S32k and S128k, B8
    # S32k contiguous and paged by 16, B64 S4k; benchmarks/results/h200_sweep_decode_2026-12-03.json,
    # one program per SM): 128-key steps, 8 warps, 2 stages, 2190 / 2757 / 3760 / 3072 / 4180 GB/s;
    # 64-key steps and 3 stages win the long contiguous caches (4089 at B8 S32k, 3148 at B1 S128k)
    # but lose paged (2431) and B1 S32k (1850). The bench at the default two programs per SM:
    # benchmarks/results/h200_bench_decode_2026-12-03.json
    return DecodeConfig(128, 8, 2)


# a paged or e4m3 cache's default up to hd128: 64-key steps, 4 warps, 3 stages.
# - Paged by 16, the paged kernel at (64, 4, 3) read at 0.98-1.02x the contiguous one at the same
#   config and at >= 0.98x the contiguous default (128, 8, 2) on the rows measured (H200 lab A/B,
#   docs/notes.md), where at (128, 8, 2) it stayed at 0.72-0.79x.
# - An e4m3 cache (the loop widens every value, so it is bound by instructions, not bytes), H200,
#   GQA 32/8 hd128, GB/s of e4m3 bytes at (64, 4, 3) / (128, 8, 2): B1 S32k 1413 / 1299, B8 S32k
#   2535 / 1682, B64 S4k 2688 / 1625; paged by 16 1287 / 823, 2252 / 1155, 2226 / 1291
#   (benchmarks/ab/h200_ab_decode_fp8kv_2026-12-03.json).
LAYOUT_DECODE_DEFAULT = DecodeConfig(64, 4, 3)
# hd64 (bf16, GQA 32/8, B8 S32k, H200, same A/B file): (64, 2, 3) read 3643 GB/s contiguous and
# 3351 paged by 16; the hd128 default (128, 8, 2) 3269 / 1999, (64, 4, 3) 3656 / 3035
NARROW_DECODE_DEFAULT = DecodeConfig(64, 2, 3)


def layout_default(spec: KernelSpec, device_kind: str = "cuda", paged: bool = False,
                   fp8_cache: bool = False) -> DecodeConfig:
    """The default config of a call by cache layout: a paged or e4m3 cache up to hd128 gets
    LAYOUT_DECODE_DEFAULT (hd64: NARROW_DECODE_DEFAULT, for both layouts), anything else the
    family default."""
    width = max(spec.head_dim_qk, spec.head_dim_v)
    if device_kind == "cpu" or width > 128 or width <= 64 or not (paged or fp8_cache):
        return default_decode_config(spec, device_kind)
    return LAYOUT_DECODE_DEFAULT


def variants(spec: KernelSpec) -> dict[str, bool]:
    return {}


def context(spec: KernelSpec) -> dict:
    return {"flag_slots": FLAG_SLOTS}


def decode_launches(mod, spec: KernelSpec, q, k_cache, v_cache, out, lse, out_part, lse_part, mask,
                    cfg: DecodeConfig, num_splits: int, split_len: int, cache_seqlens=None, block_table=None,
                    new_len: int = 0, k_descale=None, v_descale=None, use_pdl: bool | None = None,
                    flags=None, k_new=None, v_new=None, extra=None, cache_batch_idx=None, cache_leftpad=None,
                    rotary=None, counter=None) -> list:
    """q (B, Sq, Hq, D) and out (B, Sq, Hq, Dv) any strides with unit head-dim stride; caches
    (B, S_max, Hkv, D) or paged (num_pages, page_size, Hkv, D), page_size a multiple of 16, with
    block_table (B, max_pages) int32; lse (B, Hq, Sq) fp32; out_part / lse_part fp32 scratch of
    partial_shapes() (unused with one split). cache_seqlens (B,) int32: keys already in each
    row's cache (new_len more are seen by this call), or None: every row holds k_cache.shape[1]
    keys. An e4m3 cache: k_descale / v_descale fp32 (B, Hkv) or None (1.0). use_pdl (None:
    kernels.launch.pdl(q), sm90 GPUs): a split call's combine launch follows the split kernel with
    programmatic dependent launch (it starts as the split kernel's programs leave and waits inside
    for their partial results). flags: the int32 (NUM_FLAGS,) tensor the kernels flag metadata out
    of range in (None: a scratch one). k_new / v_new (B, new_len, Hkv, D): the tokens an append
    launch (_attn_decode_append, first) writes into the caches at cache_seqlens. Whatever
    cache_seqlens and block_table hold, the kernels bound every row by the caches' capacity and
    never follow a page index outside [0, num_pages). Dense caches only: cache_batch_idx (B,) int32,
    the cache row of each batch row (the caches may have any number of rows); cache_leftpad (B,)
    int32, the cache position of each row's first key. rotary (Rotary): RoPE of the new keys and of
    q at flash-attn's positions (the template's comment); seqlen_ro must cover capacity + max(0,
    Sq - new_len) positions. A split call that fused_merge() merges in the split kernel (no
    combine launch): counter, an int32 (B * Hkv,) tensor of zeros that the kernel leaves at zero
    (None: a fresh one), counts each row's finished splits; no two calls in flight at once may
    share it."""
    require_valid_decode(spec, cfg)
    check_layout_args(q, k_cache, block_table, new_len, cache_batch_idx, cache_leftpad, rotary)
    if flags is None:
        import torch

        flags = torch.zeros(NUM_FLAGS, dtype=torch.int32, device=q.device)
    use_pdl = pdl(q) if use_pdl is None else use_pdl
    B, sq, hq, _ = q.shape
    hkv = k_cache.shape[2]
    paged = block_table is not None
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    block_m = rows_tile(hq // hkv, sq)
    qk_scale, softcap_in, softcap_out = mask.score_args()
    split = num_splits > 1
    values = {
        "Q": q, "K": k_cache, "V": v_cache, "Out": out, "Lse": lse, "OutP": out_part, "LseP": lse_part,
        "CacheSeqlens": cache_seqlens, "BlockTable": block_table, "KDescale": k_descale, "VDescale": v_descale,
        "Flags": flags, "stride_qz": q.stride(0), "stride_qm": q.stride(1), "stride_qh": q.stride(2),
        "stride_kz": k_cache.stride(0), "stride_kn": k_cache.stride(1), "stride_kh": k_cache.stride(2),
        "stride_vz": v_cache.stride(0), "stride_vn": v_cache.stride(1), "stride_vh": v_cache.stride(2),
        "stride_oz": out.stride(0), "stride_om": out.stride(1), "stride_oh": out.stride(2),
        "stride_lz": lse.stride(0), "stride_lh": lse.stride(1), "stride_lm": lse.stride(2),
        "stride_bt": block_table.stride(0) if paged else 0,
        **{f"stride_{n}d{a}": (0 if d is None else d.stride(i)) for n, d in (("k", k_descale), ("v", v_descale))
           for i, a in enumerate("zh")},
        "num_kv_heads": hkv, "seqlen_q": sq, "seqlen_k": 0 if cache_seqlens is not None else k_cache.shape[1],
        "new_len": new_len, "split_len": split_len, "num_splits": num_splits,
        "page_size": k_cache.shape[1] if paged else 1,
        "capacity": capacity, "num_pages": k_cache.shape[0],
        "CacheBatchIdx": cache_batch_idx, "CacheLeftpad": cache_leftpad,
        "RotaryCos": rotary.cos if rotary else None, "RotarySin": rotary.sin if rotary else None,
        "stride_ro": rotary.cos.stride(0) if rotary else 0, "rotary_half": rotary.cos.shape[1] if rotary else 0,
        "rotary_step": int(bool(rotary and rotary.per_token)),
        "BATCH_IDX": cache_batch_idx is not None, "LEFTPAD": cache_leftpad is not None,
        "ROTARY": rotary is not None, "ROTARY_INTERLEAVED": bool(rotary and rotary.interleaved),
        "qk_scale": qk_scale, "softcap_in": softcap_in, "softcap_out": softcap_out,
        "window_left": mask.window_left, "window_right": mask.window_right,
        "GQA": spec.gqa_ratio, "BLOCK_M": block_m, "BLOCK_N": cfg.block_n, "PAGED": paged, "HAS_SEQLENS": cache_seqlens is not None,
        "SPLIT": split, "K_DESCALE": k_descale is not None, "V_DESCALE": v_descale is not None,
        "PDL": use_pdl and split, **expr_values(extra),
    }
    grid = programs(num_splits * hkv, B, "q") if B and sq else 0
    launches = []
    if k_new is not None and new_len:
        names = ("K", "V", "CacheSeqlens", "BlockTable", "KDescale", "VDescale", "Flags", "stride_kz", "stride_kn",
                 "stride_kh", "stride_vz", "stride_vn", "stride_vh", "stride_bt", "stride_kdz", "stride_kdh",
                 "stride_vdz", "stride_vdh", "num_kv_heads", "new_len", "capacity", "num_pages", "page_size",
                 "PAGED", "K_DESCALE", "V_DESCALE", "CacheBatchIdx", "RotaryCos", "RotarySin", "stride_ro",
                 "rotary_half", "BATCH_IDX", "ROTARY", "ROTARY_INTERLEAVED")
        append = {n: values[n] for n in names}
        append.update({"KNew": k_new, "VNew": v_new})
        append.update({f"stride_{p}{a}": t.stride(i) for p, t in (("n", k_new), ("m", v_new))
                       for i, a in enumerate("zmhd")})
        # with rotary, no FMA: the new keys are rotated and rounded as PyTorch's fp32 ops would
        launches.append(Launch.of(mod, "_attn_decode_append", programs(new_len * hkv, B, "k") if B else 0, append,
                                  1, 1, fp_fusion=rotary is None))
    block_s = max(2, 1 << (num_splits - 1).bit_length())
    fused = fused_merge(cfg, num_splits)
    if fused and counter is None:
        import torch

        counter = torch.zeros(B * hkv, dtype=torch.int32, device=q.device)
    values.update({"Counter": counter if fused else None, "BLOCK_S": block_s, "FUSED": fused,
                   "PDL": values["PDL"] and not fused})
    launches.append(Launch.of(mod, "_attn_decode", grid, values, cfg.num_warps, cfg.num_stages))
    if split and not fused:
        combine = {n: values[n] for n in ("Out", "Lse", "OutP", "LseP", "stride_oz", "stride_om", "stride_oh",
                                          "stride_lz", "stride_lh", "stride_lm", "num_kv_heads", "seqlen_q",
                                          "num_splits", "GQA", "BLOCK_M", "PDL")}
        combine["BLOCK_S"] = block_s
        launches.append(Launch.of(mod, "_attn_decode_combine", B * hkv if grid else 0, combine, 4, 1,
                                  pdl=use_pdl))
    return launches


def check_layout_args(q, k_cache, block_table, new_len: int, cache_batch_idx, cache_leftpad, rotary) -> None:
    """What the kernels need of the shapes of the optional indices and tables: no cache_batch_idx or
    cache_leftpad with a paged cache (the paged walk reads whole groups of 16 keys from one page),
    and a rotary table long enough for every position the clamped cache_seqlens can give (new key t
    at cache_seqlens + t < capacity; query token i at cache_seqlens + i <= capacity - new_len + i).
    attngen.runtime.kvcache.check_args says the same to the caller first."""
    for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if t is not None and block_table is not None:
            raise ValueError(f"{name}: not with a paged cache (block_table), as flash-attn")
    if rotary is not None:
        capacity = block_table.shape[1] * k_cache.shape[1] if block_table is not None else k_cache.shape[1]
        need = capacity + max(0, q.shape[1] - new_len)
        if rotary.cos.shape[0] < need:
            raise ValueError(f"rotary_cos: {rotary.cos.shape[0]} positions; the call can reach position {need - 1} "
                             f"(a row's capacity {capacity} + {max(0, q.shape[1] - new_len)} query tokens past "
                             "the new keys)")


def partial_shapes(batch: int, kv_heads: int, num_splits: int, block_m: int, head_dim_v: int):
    """Shapes of the fp32 partial output and LSE buffers of a split call."""
    rows = batch * kv_heads * num_splits * block_m
    return (rows, _pad(head_dim_v)), (rows,)


def require_valid_decode(spec: KernelSpec, cfg: DecodeConfig) -> None:
    require_valid(spec, cfg, check_decode)


# ------------------------------------------------------------------------------------------------
# tuning hooks: what the tuner's objective (attngen.tuning.objective) needs of this family


class TuningHooks:
    """One query token per row on a full cache of seqlen_k keys (the bucket's): q (B, Sq, Hq, D),
    caches (B, S, Hkv, D); the reference per batch row in float64; throughput in GB/s of K and V
    read. One winner serves contiguous and paged caches (the runtime has one plan per bucket for
    both), so a trial runs both: the contiguous cache, then the same keys in pages of PAGE_SIZE
    in shuffled order; its time is their sum and its throughput counts the cache read twice."""

    PAGE_SIZE = 16  # vLLM's page size, and the smallest attention_with_kvcache takes
    factor = 2.0
    outputs = ("out", "lse", "out_p", "lse_p")
    unit = "GB/s"

    def throughput(self, obj, ms: float) -> float:
        p = obj.problem
        kv_bytes = p.batch * p.seqlen_k * p.heads_kv * (p.head_dim_qk + p.head_dim_v) * obj.dtype.itemsize
        return 2 * kv_bytes / ms / 1e6

    def inputs(self, obj, seed: int) -> dict:
        import torch

        p = obj.problem
        g = torch.Generator(device=obj.device).manual_seed(1000 + seed)

        def randn(*shape):
            return torch.randn(shape, generator=g, device=obj.device, dtype=torch.float32).to(obj.dtype)

        t = {"q": randn(p.batch, p.seqlen_q, p.heads_q, p.head_dim_qk),
             "k": randn(p.batch, p.seqlen_k, p.heads_kv, p.head_dim_qk),
             "v": randn(p.batch, p.seqlen_k, p.heads_kv, p.head_dim_v)}
        page = self.PAGE_SIZE
        per_row = -(-p.seqlen_k // page)
        perm = torch.randperm(p.batch * per_row, generator=torch.Generator().manual_seed(2000 + seed))
        t["table"] = perm.reshape(p.batch, per_row).to(device=obj.device, dtype=torch.int32)
        for n in ("k", "v"):
            x = t[n]
            padded = torch.zeros(p.batch, per_row * page, *x.shape[2:], device=obj.device, dtype=obj.dtype)
            padded[:, :p.seqlen_k] = x
            pages = torch.empty(p.batch * per_row, page, *x.shape[2:], device=obj.device, dtype=obj.dtype)
            pages[perm.to(obj.device)] = padded.reshape(p.batch * per_row, page, *x.shape[2:])
            t[n + "p"] = pages
        t["lens"] = torch.full((p.batch,), p.seqlen_k, device=obj.device, dtype=torch.int32)
        if obj.spec.has_expr:  # the kernel's parameter tensors and sinks
            from attngen.families import expr_tuning

            t.update(expr_tuning.inputs(obj, seed))
        for suffix in ("", "_p"):
            t["out" + suffix] = torch.empty(p.batch, p.seqlen_q, p.heads_q, p.head_dim_v, device=obj.device,
                                            dtype=obj.dtype)
            t["lse" + suffix] = torch.empty(p.batch, p.heads_q, p.seqlen_q, device=obj.device, dtype=torch.float32)
        return t

    def launch(self, obj, cfg, t: dict) -> None:
        """Both layouts' launches of config `cfg` on input set `t`. A decode step is short (tens of
        microseconds at B1), so the launches, their scratch and their compiled kernels are made once
        per (config, input set) and replayed directly, as the runtime replays a plan: building
        them and going through Triton's JIT on every timed step made the small buckets host-bound
        (a tuning run picked configs by Python time)."""
        from attngen.families.base import replay

        replay(self, obj, cfg, t)

    def steps(self, obj, cfg, t: dict) -> list:
        import torch

        from attngen.families import expr_tuning
        from attngen.kernels.launch import sm_count

        p = obj.problem
        out = []
        for paged in (False, True):
            capacity = t["table"].shape[1] * self.PAGE_SIZE if paged else p.seqlen_k
            n, split_len = splits(cfg, p.batch, p.heads_kv, capacity, sm_count(obj.device))
            part, lse_part = partial_shapes(p.batch, p.heads_kv, n, rows_tile(obj.spec.gqa_ratio, p.seqlen_q),
                                            p.head_dim_v)
            op = torch.empty(part, device=obj.device) if n > 1 else None
            lp = torch.empty(lse_part, device=obj.device) if n > 1 else None
            if paged:
                args = (t["q"], t["kp"], t["vp"], t["out_p"], t["lse_p"])
                more = (t["lens"], t["table"])
            else:  # with cache_seqlens, as attention_with_kvcache calls it
                args, more = (t["q"], t["k"], t["v"], t["out"], t["lse"]), (t["lens"],)
            out += decode_launches(obj.mod, obj.spec, *args, op, lp, obj.mask, cfg, n, split_len, *more,
                                   extra=expr_tuning.extra(t) if obj.spec.has_expr else None)
        return out

    def reference(self, obj, t: dict) -> dict:
        import torch

        from attngen.problem import attention_ref

        p = obj.problem
        kw = dict(causal=p.causal, window_size=p.window, softcap=p.softcap, scale=p.softmax_scale)
        outs = {"out64": [], "lse64": [], "out_pt": []}
        for b in range(p.batch):  # one row at a time: the float64 copy of a long cache is large
            q, k, v = (t[n][b:b + 1].transpose(1, 2) for n in ("q", "k", "v"))
            if obj.spec.has_expr:  # the kernel's expressions and sinks, per KV head
                from attngen.families import expr_tuning

                (o64, l64), (opt, _) = (expr_tuning.grouped_heads(obj, t, b, q, k, v, upcast)
                                        for upcast in (True, False))
            else:
                o64, l64 = attention_ref(q, k, v, **kw)
                opt, _ = attention_ref(q, k, v, upcast=False, **kw)
            outs["out64"].append(o64.transpose(1, 2))
            outs["lse64"].append(l64)
            outs["out_pt"].append(opt.transpose(1, 2))
        return {n: torch.cat(xs) for n, xs in outs.items()}

    def check(self, obj, name: str, t: dict, ref: dict) -> None:
        from attngen.testing import assert_flash_rule, assert_lse_close

        for suffix, what in (("", "contiguous"), ("_p", f"paged by {self.PAGE_SIZE}")):
            assert_flash_rule(f"{name} {what} out", t["out" + suffix], ref["out64"], ref["out_pt"], self.factor, 1e-5)
            assert_lse_close(f"{name} {what} lse", t["lse" + suffix], ref["lse64"])



FAMILY = Family(
    "decode", "attn_decode.py.jinja", DecodeConfig, check_decode,
    lambda spec, kind, seqlen_q=0, window=None: default_decode_config(spec, kind),
    ("_attn_decode", "_attn_decode_combine", "_attn_decode_append"), "attngen.families.decode:decode_launches", 1.0, ("out", "lse"),
    space=SPACE, portable=lambda cfg, spec: cfg, variants=variants, hooks="attngen.families.decode:TuningHooks",
    context=context)
