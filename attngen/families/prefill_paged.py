"""The prefill_paged family (`prefill_paged`, templates/attn_prefill_paged.py.jinja): chunked prefill
on a paged KV cache -- packed queries of any length per sequence (flash-attn's varlen layout)
against K / V in pages found through a block table, as `attngen.attention_varlen(...,
block_table=...)` runs it. Its launch config, validity filter, search space, defaults, its launch
and its Family record; the tuner's hooks are in prefill_paged_tuning.py.

The kernel tiles as the forward's pointer kernel does (BLOCK_M query rows x BLOCK_N keys, online
softmax, masked and unmasked key stages) and reads K / V as the decode family's paged kernel does
(16 keys of one page a group, the table read one block ahead), or, on sm90 where the pages hold
whole blocks (tma_kv), through the copy engine, one table entry a block. With pack_gqa, the query heads of
one KV head share a tile (their rows interleaved token by token), so the cache is read once per
KV head rather than once per query head.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from attngen.families.base import SMEM_LIMIT, Family, _pow2, require_valid
from attngen.families.decode import FLAG_SLOTS as DECODE_FLAG_SLOTS
from attngen.families.decode import NUM_FLAGS
from attngen.families.fwd import SPACE as FWD_SPACE
from attngen.kernels.launch import Launch, expr_values, programs
from attngen.spec import KernelSpec

# the slots of the metadata flag tensor (attngen.runtime.kvguard.flags: one per device, shared
# with the decode family) this family's kernel writes: a used block-table entry outside
# [0, num_pages) (the decode family's slot), and a sequence's key count below 0 or past its
# table's capacity (a slot of its own: the decode kernels name cache_seqlens there)
FLAG_SLOTS = {"FLAG_TABLE": DECODE_FLAG_SLOTS["FLAG_TABLE"], "FLAG_KEYS": 5}
assert FLAG_SLOTS["FLAG_KEYS"] not in DECODE_FLAG_SLOTS.values() and FLAG_SLOTS["FLAG_KEYS"] < NUM_FLAGS


@dataclass(frozen=True)
class PrefillPagedConfig:
    block_m: int  # tile rows: query tokens x the heads packed with them
    block_n: int  # keys per step of the loop (a multiple of 16: groups of 16 keys of one page)
    num_warps: int
    num_stages: int
    # the query heads of one KV head in one tile (K / V read once per KV head); False: one query
    # head per tile, as the forward
    pack_gqa: bool = True
    # _softmax.online_softmax's lazy rescaling (the forward's knob)
    lazy_rescale: bool = False
    # sm90: K / V blocks through the copy engine where a call's pages allow it (page_size a multiple
    # of block_n, pages contiguous, rows 16-byte aligned: tma_kv), else the pointer gather
    tma: bool = False

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def smem_bytes(spec: KernelSpec, cfg: PrefillPagedConfig) -> int:
    """Shared memory of the pointer kernel (2-byte elements): the Q tile, K and V per stage."""
    return 2 * (cfg.block_m * spec.pad_qk + cfg.num_stages * cfg.block_n * (spec.pad_qk + spec.pad_v))


def check_prefill_paged(spec: KernelSpec, cfg: PrefillPagedConfig) -> str | None:
    """None if `cfg` can launch `spec`'s prefill_paged kernel, else the reason (the tuner records it)."""
    if spec.varlen:
        return "prefill_paged kernels always take packed queries (their spec has varlen off)"
    if spec.has_expr and cfg.pack_gqa and spec.gqa_ratio > 1:
        return "a kernel with expressions takes one query head a tile (pack_gqa off): h is one value a tile"
    if not (_pow2(cfg.block_m) and _pow2(cfg.block_n)):
        return "block sizes must be powers of two"
    if not (16 <= cfg.block_m <= 256 and 16 <= cfg.block_n <= 256):
        return "block sizes go from 16 (a tensor-core tile; 16 keys of one page) to 256"
    if cfg.num_warps not in (1, 2, 4, 8):
        return "num_warps must be 1, 2, 4 or 8"
    if cfg.num_stages < 1:
        return "num_stages must be >= 1"
    if cfg.tma and spec.target != "sm90":
        return "tma (K / V through the copy engine) needs an sm90 target"
    need, have = smem_bytes(spec, cfg), SMEM_LIMIT.get(spec.target, SMEM_LIMIT["sm80"])
    if need > have:
        return f"needs ~{need} B of shared memory, {spec.target} has {have}"
    return None


# the forward's tile space (its pointer kernel has the same loop), and the GQA packing
SPACE: dict[str, tuple] = {**FWD_SPACE, "pack_gqa": (True, False), "tma": (True, False)}

# Defaults: the forward pointer kernel's sm80 defaults per head dim (families/fwd.py:
# default_fwd_config), with the tile rows counted as packed rows (query tokens x the GQA ratio);
# on sm90, tma for one query head a tile at head dims 65-128 (used where a call's pages allow
# it: tma_kv).
SHORT_ROWS = 1024  # up to this many packed rows per sequence, 64-row tiles fill the GPU better


def default_prefill_paged_config(spec: KernelSpec, device_kind: str = "cuda", seqlen_q: int = 0,
                                 window: int | None = None) -> PrefillPagedConfig:
    """The family's default: big tiles in the interpreter (its cost is per tile operation), else
    by head dim, mask and the bucket's query length (seqlen_q: the longest chunk's class)."""
    pack = not spec.has_expr  # expression kernels: one query head a tile (check_prefill_paged)
    # the copy engine where a call's pages allow it (tma_kv), where it measured ahead (H100,
    # benchmarks/results/h100_bench_prefill_paged_tma_2026-12-06.json): one query head a tile at
    # head dims 65-128 (hd128 MHA 1.19x the pointer gather); hd64 lost (0.92x), and GQA-packed
    # tiles are not measured yet (that run's GQA hd128 rows ran a stale build without it)
    d = max(spec.head_dim_qk, spec.head_dim_v)
    one_head = spec.gqa_ratio == 1 or not pack
    tma = spec.target == "sm90" and device_kind != "cpu" and 64 < d <= 128 and one_head
    return dataclasses.replace(_default(spec, device_kind, seqlen_q), pack_gqa=pack, tma=tma)


def _default(spec: KernelSpec, device_kind: str, seqlen_q: int) -> PrefillPagedConfig:
    if device_kind == "cpu":
        return PrefillPagedConfig(64, 64, 4, 1)
    d = max(spec.head_dim_qk, spec.head_dim_v)
    if d > 128:
        return PrefillPagedConfig(64, 32, 4, 2)
    if spec.mask == "sliding_window":
        return PrefillPagedConfig(64, 64, 4, 2)
    rows = seqlen_q * spec.gqa_ratio
    return PrefillPagedConfig(64, 64, 4, 3) if 0 < rows <= SHORT_ROWS else PrefillPagedConfig(128, 64, 8, 3)


def tma_kv(cfg: PrefillPagedConfig, k, v) -> bool:
    """Whether a launch with `cfg` reads these K / V pools (num_pages, page_size, Hkv, D) through the
    copy engine: cfg.tma, each block of block_n keys inside one page (page_size a multiple of
    block_n), pages back to back (a page's stride is page_size rows), unit head-dim stride, and
    16-byte aligned bases and rows (descriptors over each KV head's (num_pages x page_size) rows)."""
    if not cfg.tma:
        return False
    for t in (k, v):
        num_pages, page_size, _, _ = t.shape
        es = t.element_size()
        if (t.numel() == 0 or page_size % cfg.block_n or t.stride(3) != 1 or t.stride(0) != page_size * t.stride(1)
                or t.data_ptr() % 16 or (t.stride(1) * es) % 16 or (t.stride(2) * es) % 16
                or num_pages * page_size >= 2 ** 31):
            return False
    return True


def row_heads(spec: KernelSpec, cfg: PrefillPagedConfig) -> int:
    """Query heads per tile row group: the GQA ratio when packed, else 1."""
    return spec.gqa_ratio if cfg.pack_gqa else 1


def prefill_paged_launches(mod, spec: KernelSpec, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
                           block_table, max_seqlen_q: int, mask, cfg: PrefillPagedConfig,
                           flags=None, extra: dict | None = None) -> list[Launch]:
    """q (total_q, Hq, D), out (total_q, Hq, Dv), lse (Hq, total_q) fp32; k / v (num_pages,
    page_size, Hkv, D) with page_size a multiple of 16 and block_table (B, max_pages) int32;
    cu_seqlens_q (B + 1,) int32; the key counts from seqused_k (B,) int32, or, when it is None,
    from cu_seqlens_k (B + 1,) int32. Head dims contiguous. max_seqlen_q: at least the longest
    chunk (the grid's query blocks). flags: the int32 (NUM_FLAGS,) tensor the kernel flags
    metadata out of range in (None: a scratch one). Whatever the key counts and the table hold,
    the kernel reads the table only inside a sequence's row and no page outside [0, num_pages).
    extra: an expression kernel's parameter tensors and sinks (kernels.launch.expr_values)."""
    require_valid(spec, cfg, check_prefill_paged)
    if flags is None:
        import torch

        flags = torch.zeros(NUM_FLAGS, dtype=torch.int32, device=q.device)
    total_q, hq, _ = q.shape
    num_pages, page_size, hkv, _ = k.shape
    seqs = cu_seqlens_q.numel() - 1
    rh = row_heads(spec, cfg)
    groups = hq // rh
    blocks = -(-max_seqlen_q * rh // cfg.block_m) if total_q else 0
    qk_scale, softcap_in, softcap_out = mask.score_args()
    tma = tma_kv(cfg, k, v)
    values = {
        "Q": q, "K": k, "V": v, "Out": out, "Lse": lse, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k,
        "SequsedK": seqused_k, "BlockTable": block_table, "Flags": flags,
        "stride_qm": q.stride(0), "stride_qh": q.stride(1), "stride_om": out.stride(0), "stride_oh": out.stride(1),
        "stride_kz": k.stride(0), "stride_kn": k.stride(1), "stride_kh": k.stride(2),
        "stride_vz": v.stride(0), "stride_vn": v.stride(1), "stride_vh": v.stride(2),
        "stride_lh": lse.stride(0), "stride_lm": lse.stride(1), "stride_bt": block_table.stride(0),
        "num_groups": groups, "num_m_blocks": blocks, "page_size": page_size,
        "capacity": block_table.shape[1] * page_size, "num_pages": num_pages,
        "qk_scale": qk_scale, "softcap_in": softcap_in, "softcap_out": softcap_out,
        "window_left": mask.window_left, "window_right": mask.window_right,
        "GQA": spec.gqa_ratio, "ROW_HEADS": rh, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
        "HAS_SEQUSED": seqused_k is not None, "ALIGN_TOP_LEFT": mask.align_top_left,
        "LAZY_RESCALE": bool(cfg.lazy_rescale), "TMA_KV": tma, **expr_values(extra),
    }
    grid = programs(blocks, seqs * groups, "q") if blocks and seqs else 0
    return [Launch.of(mod, "_attn_prefill_paged", grid, values, cfg.num_warps, cfg.num_stages, scratch=tma)]


def variants(spec: KernelSpec) -> dict[str, bool]:
    return {}


def context(spec: KernelSpec) -> dict:
    return {"flag_slots": FLAG_SLOTS}


FAMILY = Family(
    "prefill_paged", "attn_prefill_paged.py.jinja", PrefillPagedConfig, check_prefill_paged,
    default_prefill_paged_config, ("_attn_prefill_paged",),
    "attngen.families.prefill_paged:prefill_paged_launches", 1.0, ("out", "lse"),
    space=SPACE, portable=lambda cfg, spec: cfg, variants=variants,
    hooks="attngen.families.prefill_paged_tuning:TuningHooks", context=context,
    # ATTNGEN_KERNEL_DESCRIPTORS=0: the pointer gather (K / V through the copy engine makes the
    # descriptors in the kernel)
    host_descriptors=lambda cfg, spec: dataclasses.replace(cfg, tma=False) if cfg.tma else cfg)
